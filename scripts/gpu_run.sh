#!/usr/bin/env bash
# One call on the GPU machine: runs the named steps and leaves everything in $OUT/$KB_NAME.tgz
# (report folders, logs; KB_NAME defaults to "evidence"), so a call that is cut off still returns
# what it measured. Several invocations in one call (one per GPU, say) each need their own KB_NAME.
#
#   scripts/gpu_run.sh env selfcheck gputests ci          # steps run in the order given
#   scripts/gpu_run.sh "kb:run rmsnorm -w sweep-n256-bf16" # any kernelbench command; its report
#                                                          # folder is named after the step
#   scripts/gpu_run.sh "kbat:.before/f6f0b73:run rmsnorm -w host-8x4096"  # the same from another tree
# Peer packages (adam-mini, liger-kernel, adafactor8bit) travel as wheels in .whl/ (carried).
# The copy of the tree there has no .git: prefix the call with KERNELBENCH_GIT_SHA=<commit> so
# the reports record which commit they measured. A PYTHONPATH given to the call is kept (a plugin's
# source folder, e.g. PYTHONPATH=$PWD/examples/my_rmsnorm/src, loaded with --plugin my_rmsnorm.plugin).
set -uo pipefail
OUT=${OUT:-/tmp/kb-out}
NAME=${KB_NAME:-evidence}
WORK=${KB_WORK:-/tmp/kb-$NAME}  # one per invocation (each on its own GPUs: CUDA_VISIBLE_DEVICES)
# STEP_TIMEOUT: seconds per kb: step (550), so several jobs in one call each end, packed, before it does.
if [ -e "$OUT/$NAME.tgz" ]; then
  echo "gpu_run.sh: $OUT/$NAME.tgz exists: another invocation in this call packs into it; give each its own KB_NAME" >&2
  exit 2
fi
rm -rf "$WORK/reports" "$WORK/logs"  # a machine kept warm would otherwise pack an earlier call's files
mkdir -p "$OUT" "$WORK/reports" "$WORK/logs"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" .whl/*.whl \
    && export PYTHONPATH=$WORK/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

pack() { tar czf "$OUT/$NAME.tgz" -C "$WORK" reports logs 2>/dev/null; }
trap pack EXIT

run_step() {  # name, timeout, command...
  local name=$1 limit=$2; shift 2
  echo "=== $name ($(date -u +%H:%M:%S))"
  timeout -k 30 "$limit" "$@" > "$WORK/logs/$name.log" 2>&1  # KILL 30 s after a TERM not heeded
  local rc=$?
  echo "--- $name exit $rc"
  tail -n 25 "$WORK/logs/$name.log"
}

n=0
for step in "$@"; do
  n=$((n + 1))
  case "$step" in
    env) run_step env 120 python3 -m kernelbench env --json ;;
    selfcheck) run_step selfcheck 300 python3 scripts/timing_selfcheck.py ;;
    # -p no:logging: pytest's log capture hooks torch's structured-trace logger, which then
    # renders every Inductor IR payload (minutes for a whole compiled model).
    gputests)  # each file on its own, so that one that hangs costs only its own limit
      for file in tests/gpu/test_*.py; do
        run_step "gputests-$(basename "$file" .py)" "${GPUTESTS_TIMEOUT:-240}" \
          env KERNELBENCH_PRINT_FAILURES=1 python3 -m pytest -m gpu "$file" -v -p no:cacheprovider -p no:logging -rfs --durations=5
      done ;;
    gputests:*) run_step "gputests-$n" "${GPUTESTS_TIMEOUT:-500}" env KERNELBENCH_PRINT_FAILURES=1 python3 -m pytest -m gpu ${step#gputests:} -v -p no:cacheprovider -p no:logging -rfs --durations=5 ;;
    ci) run_step ci 550 python3 -m kernelbench run --config configs/ci.toml --output-dir "$WORK/reports/ci" ;;
    kb:*)
      name="step$n-$(echo "${step#kb:}" | tr -cs 'A-Za-z0-9' '-' | cut -c1-60)"
      # shellcheck disable=SC2086
      run_step "$name" "${STEP_TIMEOUT:-550}" python3 -m kernelbench ${step#kb:} --output-dir "$WORK/reports/$name" ;;
    kbat:*)  # kbat:<tree>:<args>: kernelbench from another source tree (a carried worktree of an
      # earlier commit), for a before / after on one host; its report folder is named after the step
      rest=${step#kbat:}; tree=${rest%%:*}; args=${rest#*:}
      name="step$n-$(basename "$tree")-$(echo "$args" | tr -cs 'A-Za-z0-9' '-' | cut -c1-50)"
      # Run from inside the tree: python -m puts the working directory first on sys.path.
      # shellcheck disable=SC2086
      run_step "$name" 550 env -C "$tree" PYTHONPATH="$PWD/$tree${PYTHONPATH#"$PWD"}" \
        KERNELBENCH_GIT_SHA="$(basename "$tree")" python3 -m kernelbench $args \
        --output-dir "$WORK/reports/$name" ;;
    py:*) run_step "step$n-py" 550 python3 ${step#py:} ;;
    *) echo "unknown step $step" ;;
  esac
  pack
done
