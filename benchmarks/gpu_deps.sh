#!/usr/bin/env bash
# Build .gpu-deps/site.tar.xz: the Python packages the GPU check needs that the GPU machine's image
# lacks, for its python3 (3.12, x86-64), as one archive small enough to travel with the repository.
#
#   bash benchmarks/gpu_deps.sh [OUT_DIR]        (make gpu-deps; needs the package index, run it here)
#
# Why: the GPU machine reaches no package index and runs its own python3 with its own torch, so the
# project's .venv (Python 3.11 here, gigabytes) cannot go there. Its image has torch, numpy, pandas,
# scipy, matplotlib, pytest and most small libraries, but not Flower, Ray, lpips or piq
# (the device machine's own notes list what it has). The list below is what flwr[simulation]==1.42.0,
# lpips and piq need beyond that image, at the versions of this project's .venv, plus the libraries
# whose versions Flower's generated code depends on (grpcio, protobuf) or pins (typer, click, rich),
# so the GPU machine runs the same combination as the test suite here.
#
# Ray's wheel alone is 74 MB and a call to the GPU machine carries 64 MiB in all, so the packages are
# installed into a folder here (pip --target for the other platform), pruned of what a simulation
# never loads (Ray's Java jars, RLlib, LLM and dashboard front-end), their binaries stripped of
# symbols, their console scripts pointed at `python3`, and packed with xz: about 30 MB.
# benchmarks/gpu_check.py unpacks it (--deps) when flwr or ray is missing.
set -euo pipefail

OUT=${1:-.gpu-deps}
PY=${PY:-.venv/bin/python}
PYVER=${PYVER:-3.12}
CACHE=${CACHE:-${TMPDIR:-/tmp}/fl-attack-gpu-wheels-$PYVER}
PACKAGES=(
    flwr==1.42.0 ray==2.55.1 lpips==0.1.4 piq==0.8.0
    alembic==1.20.1 annotated-types==0.8.0 cffi==2.1.1 cryptography==50.0.2 fastapi==0.138.2
    greenlet==3.5.6 grpcio-health-checking==1.81.1 httptools==0.9.0 iterators==0.0.2
    jsonschema==4.26.0 jsonschema-specifications==2025.9.1 mako==1.4.3 prompt-toolkit==3.0.53
    pycparser==3.12 pycryptodome==3.24.1 pydantic==2.14.4 pydantic-core==2.50.5 python-dotenv==1.2.4
    referencing==0.37.0 rpds-py==2026.9.1 sqlalchemy==2.1.9 starlette==1.3.1 tomli==2.5.0
    tomli-w==1.2.0 typing-inspection==0.4.5 uvicorn==0.49.0 watchfiles==1.3.0 wcwidth==0.9.4
    websockets==17.4
    grpcio==1.85.3 protobuf==6.33.6 typer==0.20.1 click==8.5.1 rich==14.3.4 packaging==25.0
    pathspec==1.1.1 shellingham==1.5.4
)
PLATFORM=(--only-binary=:all: --python-version "$PYVER" --implementation cp)
for p in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1; do
    PLATFORM+=(--platform "${p}_x86_64")
done

test -x "$PY" || PY=python3
mkdir -p "$CACHE" "$OUT"
echo "gpu-deps: downloading ${#PACKAGES[@]} wheels for CPython $PYVER x86-64 into $CACHE"
"$PY" -m pip download -q --no-deps "${PLATFORM[@]}" -d "$CACHE" "${PACKAGES[@]}"

STAGE=$(mktemp -d "${TMPDIR:-/tmp}/fl-attack-gpu-site.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
wheels=()
for spec in "${PACKAGES[@]}"; do  # exactly the pinned versions, even if the cache holds others
    name=${spec%%==*}
    version=${spec##*==}
    pattern="$(echo "$name" | tr '-' '_' | tr '[:upper:]' '[:lower:]')-$version-"
    found=$(find "$CACHE" -maxdepth 1 -iname "${pattern}*.whl" | head -n 1)
    test -n "$found" || { echo "gpu-deps: error: no wheel for $spec in $CACHE" >&2; exit 1; }
    wheels+=("$found")
done
"$PY" -m pip install -q --no-deps --no-index --no-compile "${PLATFORM[@]}" --target "$STAGE/site" "${wheels[@]}"

site=$STAGE/site
rm -rf "$site/ray/jars" "$site/ray/rllib" "$site/ray/llm" "$site/ray/dashboard/client/build"
find "$site" -name '*.js.map' -delete
find "$site" -name '__pycache__' -type d -prune -exec rm -rf {} +
if command -v strip >/dev/null; then
    find "$site" -type f \( -name '*.so' -o -name '*.so.*' -o -perm -u+x \) -print0 |
        while IFS= read -r -d '' f; do
            if head -c 4 "$f" | grep -q 'ELF'; then strip --strip-unneeded "$f" 2>/dev/null || true; fi
        done
fi
for script in "$site"/bin/*; do  # pip wrote this machine's interpreter into them
    sed -i '1s|^#!.*python.*$|#!/usr/bin/env python3|' "$script"
done
printf '%s\n' "${PACKAGES[@]}" >"$site/FL_ATTACK_GPU_DEPS.txt"

echo "gpu-deps: packing $(du -sh "$site" | cut -f1) with xz (a few minutes)"
tar -C "$site" -cf - . | xz -9 -T0 >"$OUT/site.tar.xz.tmp"
mv "$OUT/site.tar.xz.tmp" "$OUT/site.tar.xz"
size=$(stat -c %s "$OUT/site.tar.xz")
echo "gpu-deps: wrote $OUT/site.tar.xz ($((size / 1024 / 1024)) MiB); carry it to the GPU machine (docs/gpu-check.md)"
if [ "$size" -gt $((40 * 1024 * 1024)) ]; then
    echo "gpu-deps: warning: over 40 MiB; with the repository (about 23 MiB) it may exceed the 64 MiB a call carries" >&2
fi
