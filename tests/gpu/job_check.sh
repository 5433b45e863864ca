#!/usr/bin/env bash
# A short job through the whole training loop, on the device given: the launcher, horovodrun
# in elastic mode, one slot per GPU on this host (one slot on the CPU), fp16 at staleness 2,
# checkpoints written from the device's tensors, evaluation, the summary (MLflow off: a GPU host
# lent for checks has no mlflow; one host, so Horovod is told the interface, lo, instead of
# probing two hosts for it). run_checks.sh runs it
# with cuda; `bash tests/gpu/job_check.sh cpu` rehearses the same commands on any machine.
# Usage: bash tests/gpu/job_check.sh cuda|cpu [builtin|quickstart]   (env: PYTHON, default .venv/bin/python)
#   builtin (the default): the built-in ResNet task; quickstart: a user's task file
#   (examples/quickstart/task.py: its own model, data, AdamW, loss and evaluation) at int8
#   and staleness 2, its batches moved to the device by the loop.
# Exit 0 when the job finished every step on that device; its summary is printed.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
device=${1:-}
[[ $device == cuda || $device == cpu ]] || { echo "job_check: say cuda or cpu (the device to train on)."; exit 2; }
task=${2:-builtin}
[[ $task == builtin || $task == quickstart ]] || { echo "job_check: the task is builtin or quickstart, not $task."; exit 2; }
PY=${PYTHON:-}
if [[ -z $PY ]]; then
    if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
slots=1
if [[ $device == cuda ]]; then
    slots=$("$PY" -c 'import torch; print(torch.cuda.device_count())') || exit 1
fi
steps=200
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [[ $task == builtin ]]; then
    codec=fp16
    task_lines="model: {depth: 8, width: 16}
optimizer: {lr: 0.05, warmup_steps: 20}"
else
    codec=int8
    task_lines="task: $PWD/examples/quickstart/task.py
task_settings: {hidden: 64}
optimizer: {lr: 0.003, weight_decay: 0.01, lr_scaling: none, warmup_steps: 20}"
fi
cat >"$work/job.yaml" <<EOF
run: {name: job-check, output_dir: $work/runs}
$task_lines
data: {batch_size: 32}
exchange: {codec: $codec, staleness: 2, min_compress_elements: 0, compress_after: 0.0}
train: {steps: $steps, commit_every: 10, checkpoint_every: 50, log_every: 10, eval_every: 100, device: $device}
cluster: {min_np: 1, max_np: $slots, network_interface: lo}
tracking: {enabled: false}
EOF

echo "job_check: the $task task, $steps steps on $device, $slots slot(s) on localhost, $codec at staleness 2"
"$PY" -m transientvod.cli train --config "$work/job.yaml" \
    --discovery "$PY launch/local_hosts.py --phase 0=localhost:$slots" || {
    echo "job_check: FAILED: the job exited with status $? (its output above)."
    exit 1
}
"$PY" - "$work/runs/job-check" "$steps" "$device" <<'PY'
import json, pathlib, sys
run, steps, device = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
summary = json.loads((run / "summary.json").read_text())
print(json.dumps(summary, indent=2))
store = pathlib.Path(summary["checkpoint"])  # the job's local checkpoint store (its directory)
checkpoints = sorted(p.name for p in store.rglob("*") if p.is_file()) if store.is_dir() else []
print(f"checkpoint files in {store}: {len(checkpoints)}")
if summary.get("steps") != steps:
    sys.exit(f"job_check: FAILED: the job ended at step {summary.get('steps')}, not {steps}.")
if not checkpoints:
    sys.exit("job_check: FAILED: the job wrote no checkpoint.")
print(f"job_check: PASSED ({steps} steps on {device})")
PY
