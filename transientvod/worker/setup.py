"""What every worker process sets up, in task mode (train.py) and library mode (library/):
its device, its interruption-notice watcher, the benchmarks' stand-in for accelerator time, and
the parameters' checksum that the job's events record after every sync, and the report of an
error that stops the whole job."""
from __future__ import annotations

import logging
import os
import random
import sys
import time
import zlib

import torch

import horovod.torch as hvd

from transientvod.channel.protocol import JOB_ERRORS, LAUNCHER_ENV
from transientvod.config import Config, ConfigError

log = logging.getLogger(__name__)


def benchmark_delay():
    """For benchmarks only, two environment variables that add sleep after each step:

    - TRANSIENTVOD_STEP_SECONDS="S": every rank sleeps S seconds, a stand-in for accelerator
      time that does not compete for this machine's few cores (so a step costs about the same
      at any world size, as it does with one GPU per worker);
    - TRANSIENTVOD_STRAGGLER="RANK:SECONDS": that rank also sleeps a random 0..SECONDS, a
      straggler the exchange has to absorb.
    """
    fixed = float(os.environ.get("TRANSIENTVOD_STEP_SECONDS", "0") or 0)
    rank_text, _, seconds_text = os.environ.get("TRANSIENTVOD_STRAGGLER", "").partition(":")
    if not fixed and not seconds_text:
        return None
    rng = random.Random(1234)
    straggler, extra = (int(rank_text), float(seconds_text)) if seconds_text else (-1, 0.0)
    return lambda: time.sleep(fixed + (rng.uniform(0, extra) if hvd.rank() == straggler else 0.0))


def start_notice_watcher(config: Config):
    """This server's interruption-notice watcher, or None when notices are off."""
    if config.notices.source == "none":
        return None
    from transientvod.spot.hosts import register_worker
    from transientvod.spot.notices.watcher import NoticeWatcher, notice_source

    host = os.environ.get("HOROVOD_HOSTNAME") or None
    if config.notices.source == "hoststate" and host:
        # A replayed revocation kills the workers of its host, as the cloud would.
        register_worker(config.host_state_file, host, os.getpid())
    if config.spot.provider == "trace" and not config.spot.notices:
        return None  # a replay without notices has none to watch for: no watcher, no vote
    source = notice_source(config.notices.source, url=config.notices.url or None,
                           state_file=config.host_state_file, host_name=host)
    return NoticeWatcher(source, poll_seconds=config.notices.poll_seconds).start()


def pick_device(config: Config) -> torch.device:
    """One GPU per slot on GPU hosts; CPU otherwise."""
    want_cuda = config.train.device == "cuda" or (config.train.device == "auto" and torch.cuda.is_available())
    if want_cuda:
        if not torch.cuda.is_available():
            raise ConfigError("train.device is 'cuda' but this host has no usable CUDA device; set train.device to auto or cpu.")
        gpus, slot = torch.cuda.device_count(), hvd.local_rank()
        if slot >= gpus:
            # Two slots on one GPU would fail later, deep in NCCL ("Duplicate GPU detected").
            raise ConfigError(f"this host runs {hvd.local_size()} slots but has {gpus} GPU(s); give it at most "
                              f"{gpus} slot(s) in the host discovery (host:{gpus}) or set train.device to cpu.")
        torch.cuda.set_device(slot)
        return torch.device("cuda", slot)
    # Local slots share the cores: give each an equal part so they don't oversubscribe.
    threads = config.train.threads_per_worker or max(1, usable_cores() // hvd.local_size())
    torch.set_num_threads(threads)
    # The numba kernels have their own thread pool, sized to every core by default: with
    # several workers per machine its threads would fight the other workers' for the cores.
    import numba
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    return torch.device("cpu")


def parameter_checksum(model: torch.nn.Module) -> str:
    """CRC32 of every parameter and buffer: equal on all ranks iff their models are equal."""
    crc = 0
    for tensor in model.state_dict().values():
        crc = zlib.crc32(tensor.detach().cpu().contiguous().numpy().tobytes(), crc)
    return f"{crc:08x}"


def report_job_error(record, error: Exception) -> None:
    """An error that stops the whole job, into the run's records: the launcher prints it once
    and stops horovodrun (launcher.py). Without it, the other ranks would go on without this
    one, or each print the same traceback. A TaskFailed carries the traceback of the task's
    own code; the others are one sentence."""
    rank = hvd.rank() if hvd.is_initialized() else -1
    details = getattr(error, "details", "")
    record.append(JOB_ERRORS, {"rank": rank, "host": os.environ.get("HOROVOD_HOSTNAME", ""), "error": str(error),
                               "traceback": details, "time": time.time()})
    if hasattr(record, "flush"):
        record.flush()  # before this process exits: the launcher stops the job on it
    log.error("rank %d: %s", rank, error)
    if details and not os.environ.get(LAUNCHER_ENV):
        # Started by hand, without the launcher: nobody else will print it.
        log.error("%s", details)


def report_uncaught_errors(record, script: str) -> None:
    """Library mode: an exception the script lets escape (its own code's, not Horovod's two
    recoveries) stops the whole job as a task's does: recorded for the launcher, which prints
    its traceback once and ends horovodrun, instead of the survivors training on without
    this rank, or every rank printing the same traceback."""
    from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

    from transientvod.tasks import TaskFailed

    previous = sys.excepthook

    def hook(kind, error, traceback):
        if not issubclass(kind, Exception) or issubclass(kind, (HorovodInternalError, HostsUpdatedInterrupt)):
            return previous(kind, error, traceback)
        try:
            report_job_error(record, TaskFailed("a step", script, error, kind="script"))
        except Exception:  # noqa: BLE001: the record itself failed; Python's own report still comes
            return previous(kind, error, traceback)
        if hasattr(record, "close"):
            record.close()

    sys.excepthook = hook


def usable_cores() -> int:
    """The cores this process may run on: a container's cpuset or a taskset leaves fewer than
    the machine has (os.cpu_count), and threads beyond them only take turns."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no sched_getaffinity on this platform
        return os.cpu_count() or 1
