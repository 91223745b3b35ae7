#!/usr/bin/env bash
# Runs a Python command against an AddressSanitizer + UBSan build of nezha._core.
#   usage: scripts/asan_python.sh BUILD_DIR PYTHON ARGS...
# BUILD_DIR holds the sanitized _core module (make build/asan-py/.built). A staging folder next to it
# mirrors the nezha package with that module in place of the installed one; a sitecustomize takes the
# editable install's import hook out of the way, so every process of the run (nezharun's ranks too)
# imports the sanitized core. The interpreter itself is not instrumented: libasan is preloaded.
set -euo pipefail
build=$(cd "$1" && pwd); shift
repo=$(cd "$(dirname "$0")/.." && pwd)
stage="$build/site"
rm -rf "$stage"
mkdir -p "$stage/nezha"
for entry in "$repo"/nezha/*; do
  case "$(basename "$entry")" in _core*.so|__pycache__) continue ;; esac
  ln -s "$entry" "$stage/nezha/"
done
core=$(find "$build" -maxdepth 1 -name '_core*.so' | head -n 1)
[ -n "$core" ] || { echo "no _core module in $build" >&2; exit 1; }
ln -s "$core" "$stage/nezha/"
cat > "$stage/sitecustomize.py" <<'PY'
# Sanitizer runs only: import nezha from this folder, not through the editable install's finder.
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "ScikitBuild" not in type(f).__name__]
PY
libasan=$(g++ -print-file-name=libasan.so)
libubsan=$(g++ -print-file-name=libubsan.so)
# Python's own arenas hide its objects from ASan; plain malloc lets it see every buffer. Leaks are
# not checked here: the interpreter keeps many objects until exit by design.
export PYTHONMALLOC=malloc
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=0:detect_stack_use_after_return=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LD_PRELOAD="$libasan $libubsan${LD_PRELOAD:+ $LD_PRELOAD}"
export PYTHONPATH="$stage${PYTHONPATH:+:$PYTHONPATH}"
# Never the source tree's nezha/ (no _core there) through the working directory, e.g. by `python -m`.
export PYTHONSAFEPATH=1
export NEZHA_EXPECT_SANITIZED_CORE="$stage/nezha"
cd "$repo"
exec "$@"
