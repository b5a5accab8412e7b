#!/usr/bin/env bash
# Compiles fixture models (fixtures/manifest.json) to executables and runs each on its fixture
# inputs under valgrind memcheck: invalid reads/writes, uses of uninitialised values and leaks
# in the generated code or the runtime stub fail the run.
#   scripts/valgrind.sh [FIXTURE...]        (default: every fixture)
# Environment: KILN (the kiln binary; default target/debug/kiln, or $CARGO_TARGET_DIR/debug/kiln),
# THREADS (the executable's --threads, default 2: the thread pool runs too),
# KEEP (a folder to keep the artifacts in; default a temporary one), CPU (the kiln compile
# --cpu; default x86-64-v3 on x86-64: valgrind's CPU model stops at AVX2, so a build for an
# AVX-512 host would refuse to start under it).
# Prints one line per fixture (ok, VALGRIND, compile-failed, run-failed) and a summary; exits 1
# when valgrind reported an error or a run failed, 0 otherwise.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
kiln=${KILN:-${CARGO_TARGET_DIR:-$root/target}/debug/kiln}
threads=${THREADS:-2}
case "$(uname -m)" in
  x86_64) cpu=${CPU:-x86-64-v3} ;;
  *) cpu=${CPU:-} ;;
esac
cpu_opt=()
[ -n "$cpu" ] && cpu_opt=(--cpu "$cpu")
[ -x "$kiln" ] || { echo "kiln not found at $kiln (cargo build -p kiln-cli, or set KILN)" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "valgrind not found (apt install valgrind)" >&2; exit 2; }
work=${KEEP:-$(mktemp -d)}
mkdir -p "$work"
[ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT

# One line per fixture: name, then tab-separated kiln compile options, '|', executable options.
# Small rank<=1 inputs (shapes, axes, k) are offered to --bind when the model needs them at
# compile time, as the test suite does.
plan=$(python3 - "$root" "$@" <<'PY'
import json, sys
root, only = sys.argv[1], set(sys.argv[2:])
for f in json.load(open(f"{root}/fixtures/manifest.json")):
    if only and f["name"] not in only:
        continue
    opts = [f"{root}/fixtures/{f['model']}"]
    if f.get("weights"):
        opts += ["--weights", f"{root}/fixtures/{f['weights']}"]
    for name, dims in (f.get("input_shapes") or {}).items():
        opts += ["--input-shape", f"{name}={','.join(map(str, dims))}"]
    small = []
    for name, p in f["inputs"].items():
        b = open(f"{root}/fixtures/{p}", "rb").read(256)
        header = b[10:10 + (b[8] | b[9] << 8)].decode("latin1")
        shape = header.split("'shape':")[1].split(")")[0].strip(" (")
        dims = [int(d) for d in shape.split(",") if d.strip()]
        n = 1
        for d in dims:
            n *= d
        if len(dims) <= 1 and n <= 64:
            small.append(name)
    inputs = [f"{n}={root}/fixtures/{p}" for n, p in f["inputs"].items()]
    # "-": IFS=tab read collapses empty fields.
    print("\t".join([f["name"], ",".join(small) or "-"] + opts + ["|"] + inputs))
PY
) || exit 2

ok=0; bad=0; skipped=0; failed=0
while IFS=$'\t' read -r -a row; do
  name=${row[0]}; small=${row[1]}
  copts=(); inputs=(); seen_bar=0
  for a in "${row[@]:2}"; do
    if [ "$a" = "|" ]; then seen_bar=1; elif [ $seen_bar = 0 ]; then copts+=("$a"); else inputs+=("$a"); fi
  done
  exe="$work/$name"
  run_inputs=("${inputs[@]}")
  if ! "$kiln" compile "${copts[@]}" "${cpu_opt[@]}" -o "$exe" >"$work/$name.compile.log" 2>&1; then
    # Retry with the small inputs bound at compile time.
    binds=(); run_inputs=()
    for i in "${inputs[@]}"; do
      if [[ ",$small," == *",${i%%=*},"* ]]; then binds+=(--bind "$i"); else run_inputs+=("$i"); fi
    done
    if [ ${#binds[@]} = 0 ] || ! "$kiln" compile "${copts[@]}" "${cpu_opt[@]}" "${binds[@]}" -o "$exe" >"$work/$name.compile.log" 2>&1; then
      echo "compile-failed $name: $(tail -n1 "$work/$name.compile.log")"
      skipped=$((skipped + 1))
      continue
    fi
  fi
  args=()
  for i in "${run_inputs[@]}"; do args+=(--input "$i"); done
  valgrind --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite,indirect \
    --log-file="$work/$name.valgrind.log" "$exe" "${args[@]}" --output-dir "$work/$name.out" \
    --threads "$threads" >/dev/null 2>"$work/$name.stderr"
  rc=$?
  if [ $rc = 0 ]; then
    echo "ok $name"; ok=$((ok + 1))
  elif [ $rc = 99 ]; then
    echo "VALGRIND $name:"
    # The first report with its stack: the log goes away with the work folder unless KEEP.
    grep -m1 -A14 -E 'Invalid|uninitialised|definitely lost|indirectly lost' "$work/$name.valgrind.log" | sed 's/^/  /'
    bad=$((bad + 1))
  else
    echo "run-failed $name (exit $rc): $(tail -n1 "$work/$name.stderr")"
    failed=$((failed + 1))
  fi
done <<<"$plan"
echo "valgrind: $ok clean, $bad with errors, $failed failed to run, $skipped did not compile"
[ $bad = 0 ] && [ $failed = 0 ]
