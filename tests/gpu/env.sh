# Sourced by tests/gpu/run.sh: the output folder ($OUT, else gpu-out) as $out, the checkout's root as the
# working directory, $py, the carried wheels (.whl/) installed into a temporary folder, and the checkout and
# those wheels on PYTHONPATH.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
py=${PYTHON:-python3}
if compgen -G ".whl/*.whl" > /dev/null; then
    site=$(mktemp -d)
    $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl \
        && export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
