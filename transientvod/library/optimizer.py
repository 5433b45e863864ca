"""`transientvod.DistributedOptimizer`: a drop-in for `hvd.DistributedOptimizer` that sends the
gradients through transientvod's exchange (codecs, bounded staleness, buckets started during
backward; exchange.py), set by the job's config (`exchange:`).

    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    optimizer = transientvod.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    ...
    optimizer.zero_grad()
    loss_fn(model(x), y).backward()
    optimizer.step()

At staleness 0 with codec none this *is* Horovod's DistributedOptimizer (allreduces started
from the gradient hooks, averaged as Horovod averages), waited for without spinning
(horovod_wait.py). Otherwise every step goes through a `GradientExchange`: `step()` starts
this step's exchange and applies the averaged gradient of s steps ago.

What the loop calls behaves as a torch optimizer's: `zero_grad()`, `step()`, `param_groups`,
`state`, `state_dict()`, `load_state_dict()`; anything else is the wrapped optimizer's.
"""
from __future__ import annotations

import contextlib
import logging

import torch

import horovod.torch as hvd
from horovod.torch.compression import Compression
from horovod.torch.optimizer import _DistributedOptimizer

from transientvod.config import Config
from transientvod.gradients.exchange import GradientExchange
from transientvod.gradients.horovod_wait import wait_for_distributed_optimizer
from transientvod.gradients.staleness import StalenessRule
from transientvod.gradients.staleness import StaleMomentum

log = logging.getLogger(__name__)

# Horovod's `compression=` argument, as the codec it means (config exchange.codec names the others).
CODEC_OF_COMPRESSION = {Compression.none: "none", Compression.fp16: "fp16"}


def codec_for(compression, config_codec: str) -> str:
    """The codec a job runs: the config's when it names one (so that `--set exchange.codec=int8`
    changes it without editing the script), else the one the script's `compression` means."""
    if compression is not None and compression not in CODEC_OF_COMPRESSION:
        raise ValueError(f"compression={compression!r} has no transientvod codec; pass hvd.Compression.none or "
                         "hvd.Compression.fp16, or set exchange.codec (fp16, bf16, int8) in the job's config.")
    if config_codec != "none":
        return config_codec
    return CODEC_OF_COMPRESSION.get(compression, "none")


class StepCount:
    """Where the optimizer counts its steps when no elastic state does (ElasticState counts them
    itself, so that a rollback or a new worker's sync restores the count with everything else)."""

    __slots__ = ("step",)

    def __init__(self):
        self.step = 0

    def after_step(self) -> None:
        pass


class HorovodAllreduce:
    """Staleness 0, codec none: Horovod's DistributedOptimizer does the averaging."""

    __slots__ = ("owner",)

    def __init__(self, optimizer, named_parameters, backward_passes_per_step: int):
        self.owner = hvd.DistributedOptimizer(optimizer, named_parameters=named_parameters,
                                              backward_passes_per_step=backward_passes_per_step)

    def average(self, step: int) -> bool:
        # The allreduces started during backward: wait for them without Horovod's spinning
        # synchronize, which then finds them done and writes the averages into .grad.
        wait_for_distributed_optimizer(self.owner)
        self.owner.synchronize()
        return True

    def apply(self) -> None:
        with self.owner.skip_synchronize():
            self.owner.step()

    def plain_step(self) -> None:
        # The wrapped class's own step, as Horovod's broadcast_optimizer_state takes it.
        super(type(self.owner), self.owner).step()

    def zero_grad(self) -> None:
        self.owner.zero_grad()

    def drain(self) -> int:
        return 0  # nothing is in flight between steps

    def reset(self) -> None:
        pass


class HeldApplication:
    """What the exchange calls to apply an averaged gradient. Held (inside `average`), it only
    notes that one is due, so that the loop may clip the averaged gradient before `apply`."""

    __slots__ = ("optimizer", "held", "due")

    def __init__(self, optimizer):
        self.optimizer, self.held, self.due = optimizer, False, False

    def step(self) -> None:
        if self.held:
            self.due = True
        else:
            self.optimizer.step()


class ExchangeSteps:
    """Staleness s or a codec: transientvod's GradientExchange."""

    __slots__ = ("owner", "exchange", "application")

    def __init__(self, optimizer, parameters, config: Config, codec: str, backward_passes_per_step: int):
        ex = config.exchange
        self.owner = optimizer
        self.application = HeldApplication(optimizer)
        # One backward a step: buckets start from the gradient hooks. Several: every bucket
        # starts in step(), after the last backward has added its gradients.
        self.exchange = GradientExchange(
            self.application, parameters, staleness=ex.staleness, codec=codec, block=ex.block,
            min_compress_elements=ex.min_compress_elements, bucket_elements=ex.bucket_elements,
            name="transientvod.library.grads", start_in_backward=backward_passes_per_step == 1,
            # The task loop's first steps run uncompressed and synchronous (compress_after of
            # train.steps, the warm-up); a script's own loop has no train.steps, so only the
            # synchronous warm-up (a count of steps) applies here.
            stale_from_step=config.optimizer.warmup_steps if ex.sync_warmup else 0)
        if codec != "none":
            # The codec kernels' thread pool starts at every core: beside other workers on the
            # same machine it would fight theirs. Size it like torch's, as the task loop does.
            import numba
            numba.set_num_threads(min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))

    def average(self, step: int) -> bool:
        self.application.held, self.application.due = True, False
        try:
            self.exchange.step(step)
        finally:
            self.application.held = False
        return self.application.due

    def apply(self) -> None:
        self.owner.step()

    def plain_step(self) -> None:
        self.owner.step()

    def zero_grad(self) -> None:
        self.exchange.zero_grad()  # the .grad tensors are views into its buckets: never set them to None

    def drain(self) -> int:
        return self.exchange.drain()

    def reset(self) -> None:
        self.exchange.reset()


class DistributedOptimizer(torch.optim.Optimizer):
    """Wraps a torch optimizer; `step()` averages the gradients over the ring, then applies them.

    Horovod's arguments, where they mean something here:

    - `named_parameters`: the parameters in model order (buckets are cut in backward order
      from it); every parameter of the optimizer must be named, as Horovod asks.
    - `compression`: hvd.Compression.none or .fp16, the codec unless the job's config names
      one (`exchange.codec`: fp16, bf16, int8 with error feedback).
    - `backward_passes_per_step=k`: call backward k times, then step() once; the gradients
      add up locally over the k passes (not divided by k, as in Horovod) and are averaged
      over the ranks once.

    `op` (Average only), `gradient_predivide_factor`, `groups` (buckets replace them:
    `exchange.bucket_elements`), `sparse_as_dense` and `process_set` keep Horovod's defaults;
    anything else is a ValueError.

    Gradient clipping, as Horovod's scripts write it, clips the *averaged* gradient::

        optimizer.synchronize()                  # the average to be applied now is in .grad
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        with optimizer.skip_synchronize():
            optimizer.step()                     # applies the clipped average

    At staleness s the average in .grad after `synchronize()` is that of s steps ago, the one
    `step()` applies. Clipping after backward() without `synchronize()` changes nothing that is
    averaged (the buckets were sent from the gradient hooks) and is overwritten by the average.

    From the job's config: `exchange.staleness`, `codec`, `block`, `min_compress_elements`,
    `bucket_elements` (null: the staleness's default cut; no tuning, which needs train.steps),
    `sync_warmup` (the first `optimizer.warmup_steps` steps synchronous) and `stale_momentum`
    (while stale, every group's momentum, SGD's `momentum` or Adam's beta1, is lowered by
    s/(s+1) from the value it had when wrapped: schedule.StaleMomentum). The script's
    learning rate is its own: `optimizer.lr*` and `exchange.stale_lr` are the task loop's.

    In an elastic job, pass it to `transientvod.ElasticState`, which counts its steps (a
    rollback restores the count) and drops gradients in flight when the ring changes.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, named_parameters=None, compression=None,
                 backward_passes_per_step: int = 1, op=None, gradient_predivide_factor: float = 1.0, groups=None,
                 sparse_as_dense: bool = False, process_set=None, *, config: Config | None = None):
        # torch.optim.Optimizer.__init__ is not called: the wrapped optimizer owns the param
        # groups and the state, and the properties below hand out its own.
        if isinstance(optimizer, (_DistributedOptimizer, DistributedOptimizer)):
            raise ValueError("pass the plain torch optimizer: transientvod.DistributedOptimizer replaces "
                             "hvd.DistributedOptimizer rather than wrapping it.")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ValueError(f"optimizer is a {type(optimizer).__name__}; pass a torch.optim.Optimizer.")
        if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int) \
                or backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step is {backward_passes_per_step!r}; it must be a whole "
                             "number of backward passes, at least 1.")
        unsupported = [name for name, value, default in (
            ("op", op, None), ("gradient_predivide_factor", gradient_predivide_factor, 1.0), ("groups", groups, None),
            ("sparse_as_dense", sparse_as_dense, False), ("process_set", process_set, None))
            if value != default and not (name == "op" and value == hvd.Average)
            and not (name == "process_set" and value is hvd.global_process_set)]
        if unsupported:
            raise ValueError(f"{unsupported[0]} is not supported by transientvod's exchange (it averages every "
                             f"gradient over the whole ring, in buckets); leave {unsupported[0]} at its default.")
        named_parameters = list(named_parameters) if named_parameters is not None else None  # often a generator
        params = self._ordered_parameters(optimizer, named_parameters)
        if config is None:
            from transientvod.library.job import job_config
            config, _ = job_config()
        ex = config.exchange
        self.codec = codec_for(compression, ex.codec)
        self.staleness = ex.staleness
        self.backward_passes_per_step = backward_passes_per_step
        if ex.staleness == 0 and self.codec == "none":
            self._path = HorovodAllreduce(optimizer, named_parameters, backward_passes_per_step)
        else:
            self._path = ExchangeSteps(optimizer, params, config, self.codec, backward_passes_per_step)
        self._momentum = self._stale_momentum(optimizer, config)
        self._progress = StepCount()
        self._synchronized = False  # this step's average is in .grad (synchronize() ran)
        self._due = False  # and step() is to apply it
        self._should_synchronize = True
        self._local_only = False
        if hvd.rank() == 0:
            log.info("transientvod.DistributedOptimizer: codec %s, staleness %d, %d backward pass(es) a step",
                     self.codec, self.staleness, backward_passes_per_step)

    @staticmethod
    def _ordered_parameters(optimizer, named_parameters) -> list[torch.nn.Parameter]:
        in_optimizer = [p for group in optimizer.param_groups for p in group["params"]]
        if named_parameters is None:
            return in_optimizer
        named = named_parameters
        if any(not isinstance(item, tuple) or len(item) != 2 for item in named):
            raise ValueError("named_parameters must be (name, parameter) pairs, as model.named_parameters() gives.")
        names = [name for name, _ in named]
        if len(set(names)) != len(names):
            raise ValueError(f"named_parameters names {sorted({n for n in names if names.count(n) > 1})[0]!r} "
                             "twice; every name must be unique.")
        named_ids = {id(p) for _, p in named}
        if any(id(p) not in named_ids for p in in_optimizer):
            raise ValueError("the optimizer has parameters that named_parameters does not name; pass the "
                             "named_parameters of the whole model the optimizer trains.")
        in_ids = {id(p) for p in in_optimizer}
        return [p for _, p in named if id(p) in in_ids]  # model order: buckets are cut backwards from it

    @staticmethod
    def _stale_momentum(optimizer: torch.optim.Optimizer, config: Config) -> StaleMomentum:
        """Each group's momentum (SGD's, or Adam's beta1) under staleness, from its value now."""
        ex = config.exchange
        stale_from = config.optimizer.warmup_steps if ex.sync_warmup else 0
        return StaleMomentum(optimizer, StalenessRule(ex.staleness, 0.0, ex.stale_momentum, stale_from))

    # -- what a training loop calls -----------------------------------------------------------

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._path.zero_grad()

    def synchronize(self) -> None:
        """Average this step's gradients over the ring (at staleness s: apply nothing yet, and
        leave in .grad the average that step() applies now). Then clip, and step() inside
        skip_synchronize()."""
        if self._local_only:
            return
        step = self._progress.step
        self._momentum.apply(self.param_groups, step)
        self._due = self._path.average(step)
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() inside this applies what synchronize() averaged, without averaging again."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()  # forward and backward, before the exchange
        if self._local_only:
            self._path.plain_step()
            return loss
        if not self._synchronized:
            if not self._should_synchronize:
                raise RuntimeError("optimizer.step() inside skip_synchronize() without optimizer.synchronize() "
                                   "first; call synchronize() before it.")
            self.synchronize()
        if self._due:
            self._path.apply()  # skipped on every rank alike for a non-finite average, or while s fills up
        self._synchronized = False
        self._progress.step += 1
        self._progress.after_step()
        return loss

    def drain(self) -> int:
        """Apply every step's average still in flight (staleness s: the last s); how many were
        applied. ElasticState calls it before a host leaves and at the end."""
        return self._path.drain()

    # -- for ElasticState ---------------------------------------------------------------------

    def count_steps_in(self, progress) -> None:
        """Count steps in `progress.step` and call `progress.after_step()` after each."""
        self._progress = progress

    def reset(self) -> None:
        """A reset callback: the ring changed; what was in flight on the old one is dropped."""
        self._synchronized = False
        self._path.reset()

    @contextlib.contextmanager
    def local_steps(self):
        """step() inside this is the wrapped optimizer's own, with no exchange and no count.
        Horovod's broadcast_optimizer_state steps a new worker's empty optimizer (alone) to
        make its state: an exchange there would wait for ranks that never join it."""
        self._local_only = True
        try:
            yield
        finally:
            self._local_only = False

    # -- the wrapped optimizer's own ------------------------------------------------------------

    @property
    def param_groups(self):
        return self._path.owner.param_groups

    @property
    def state(self):
        return self._path.owner.state

    @property
    def defaults(self):
        return self._path.owner.defaults

    def state_dict(self):
        return self._path.owner.state_dict()

    def load_state_dict(self, state_dict) -> None:
        self._path.owner.load_state_dict(state_dict)

    def add_param_group(self, param_group) -> None:
        raise RuntimeError("add every param group before wrapping the optimizer: the exchange's buckets are "
                           "cut from the parameters it had then.")

    def __getattr__(self, name):
        # Only for names this object lacks (torch's hooks, a custom optimizer's own methods).
        if name.startswith("__") or name == "_path":
            raise AttributeError(name)
        return getattr(self._path.owner, name)

    def __repr__(self) -> str:
        return f"transientvod.DistributedOptimizer({self._path.owner!r}, codec={self.codec}, staleness={self.staleness})"
