#!/usr/bin/env bash
# Installs what this checkout's benchmarks need on a bare accelerator machine that has its own JAX
# and a local package index but no internet (the TPU v5e machines this project borrows).
#
# Before, on a machine with internet, in the repository root (both folders are ignored by git):
#   echo /.whl-tpu/ >> .git/info/exclude; echo /.whl-orig/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl-tpu tyro==1.0.17 filelock==4.3.2 gymnax==1.0.1 gymnasium==1.3.0 farama-notifications==0.0.4 \
#     seaborn==0.13.2
#   (what the machine's index lacks: tyro for the command line, filelock for the run lock; gymnax and what it imports, for
#   device_check.sh parts 1-3's gymnax tasks)
#   python3 -m pip download --no-deps -d .whl-orig nnx-ppo==0.3.0   # the original, for the side-by-side runs
# and carry both folders (the device tool's `carry`). For the rodent (device_check.sh parts 5 and 9), also
#   echo /.whl-rodent/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: (the same platform flags) -d .whl-rodent \
#     mujoco==4.0.1 mujoco-core==4.0.1 mujoco-studio==4.0.1 mujoco-mjx==3.17.0 playground==0.2.0 brax==0.14.2 \
#     jaxopt==0.8.5
#   cp .venv/lib/python3.11/site-packages/dm_control/locomotion/walkers/assets/rodent.xml .whl-rodent/
# (dm-control's wheel is 56 MB, over what a call carries; the rodent reads only its rodent.xml) and carry
# .whl-rodent too (34 MB; MuJoCo Warp, which Playground lists, is optional and left out).
#
# On the machine:   source bench/tpu_setup.sh      (sets PYTHONPATH; the original goes to /tmp/orig-site)
# (in the calling shell: `source bench/tpu_setup.sh | tail` runs it in a subshell, and PYTHONPATH is lost;
# redirect its output to a file instead)
# Then this checkout's package:   python3 bench/...;   the original:   ORIGINAL=1 python3 bench/peers/...
# The machine's JAX stays first on PYTHONPATH; what is installed here goes after it.
SITE=${SITE:-/tmp/site}
ORIG_SITE=${ORIG_SITE:-/tmp/orig-site}
_pip() { PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-compile --no-cache-dir --upgrade "$@"; }
# From the machine's own index: flax, optax, orbax-checkpoint and what they, tyro and tensorboardX need
# (not JAX, jaxlib, NumPy or SciPy: the machine's are used).
_pip --no-deps --only-binary=:all: --index-url file:///opt/pypi/simple --target "$SITE" \
  flax optax orbax-checkpoint tensorstore treescope msgpack rich markdown-it-py mdurl pygments pyyaml \
  typing-extensions absl-py etils fsspec importlib-resources zipp aiofiles humanize simplejson protobuf psutil \
  nest-asyncio docstring-parser typeguard tensorboardx tqdm packaging jaxtyping wadler-lindig \
  || return 1 2>/dev/null || exit 1
# What gymnax imports (matplotlib, seaborn's pandas, gymnasium's cloudpickle); gymnax itself comes as a wheel.
_pip --no-deps --only-binary=:all: --index-url file:///opt/pypi/simple --target "$SITE" \
  matplotlib contourpy cycler fonttools kiwisolver pyparsing python-dateutil six pillow pandas pytz tzdata \
  cloudpickle || echo 'tpu_setup.sh: what gymnax imports did not install from the index (its tasks will not run)'
if ls .whl-tpu/*.whl >/dev/null 2>&1; then
  _pip --no-deps --no-index --target "$SITE" .whl-tpu/*.whl || return 1 2>/dev/null || exit 1
elif [ ! -d "$SITE/tyro" ]; then  # a warm machine keeps $SITE: a later call need not carry the wheels again
  echo 'tpu_setup.sh: no .whl-tpu/*.whl (carry .whl-tpu; see the top of this file)' >&2; return 1 2>/dev/null || exit 1
fi
if ls .whl-rodent/*.whl >/dev/null 2>&1; then
  _pip --no-deps --only-binary=:all: --index-url file:///opt/pypi/simple --target "$SITE" \
    glfw pyopengl trimesh ml-collections lxml pillow cloudpickle xxhash \
    || return 1 2>/dev/null || exit 1
  _pip --no-deps --no-index --target "$SITE" .whl-rodent/*.whl || return 1 2>/dev/null || exit 1
  # dm_control as the rodent finds it: a package folder holding rodent.xml (its code is never imported)
  mkdir -p "$SITE/dm_control/locomotion/walkers/assets" && touch "$SITE/dm_control/__init__.py" \
    && cp .whl-rodent/rodent.xml "$SITE/dm_control/locomotion/walkers/assets/" \
    || echo 'tpu_setup.sh: .whl-rodent/rodent.xml is missing (see the top of this file): the rodent task cannot build' >&2
fi
if ls .whl-orig/*.whl >/dev/null 2>&1; then
  _pip --no-deps --no-index --target "$ORIG_SITE" .whl-orig/*.whl || return 1 2>/dev/null || exit 1
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$SITE"
export ORIG_PYTHONPATH="$PYTHONPATH:$ORIG_SITE"
echo "installed into $SITE (and the original into $ORIG_SITE); PYTHONPATH=$PYTHONPATH"
