"""Waiting for Horovod without spinning (transientvod/horovod_wait.py), through horovodrun."""
from __future__ import annotations

from conftest import run_probe


def test_a_rank_waiting_for_a_late_peer_polls_instead_of_spinning_and_gets_the_same_results():
    # Every collective transientvod waits for itself: async ops, the optimizer's, the
    # evaluation's, the elastic state's extra broadcast (Horovod's own TorchState.sync still spins).
    rows = {row["rank"]: row for row in run_probe("wait_probe.py", 2)}
    waiter = rows[1]
    # Results: sums of 1 and 2; the optimizer applied the average gradient, inputs 1 and 2.
    for row in rows.values():
        assert row["sums"] == [3.0, 3.0], row
        assert row["optimizer_update"] == [1.5] * 4, row
        assert row["accuracy"] == rows[0]["rank0_alone"], row  # rank 0's model, on every rank
        assert row["broadcast"] == [[0, 1, 2], [1.0]], row  # rank 0's tensors
    # Horovod's synchronize keeps a core busy for the whole 2 s (the control); the polite
    # waits cost the background thread's coordination, a small part of a core. The control
    # runs on the same machine at the same moment, so a loaded machine lowers both.
    assert waiter["spin_cpu"] > 0.5, waiter
    for wait in ("wait_cpu", "optimizer_cpu", "evaluate_cpu", "broadcast_cpu"):
        assert waiter[wait] < 0.35 and waiter[wait] * 2 < waiter["spin_cpu"], waiter
