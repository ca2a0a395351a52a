#!/usr/bin/env bash
# Install into a checkout's .git/config the output-stripping filter that .gitattributes names for
# notebooks/*.ipynb (nbstripout, keeping cell ids as jupytext writes them), so a notebook saved
# with outputs is committed without them. Idempotent; `make setup` runs it.
#   scripts/install_git_filter.sh PYTHON [CHECKOUT]   (PYTHON: an interpreter with nbstripout)
set -euo pipefail
python=${1:?usage: install_git_filter.sh PYTHON [CHECKOUT]}
checkout=${2:-.}
if ! git -C "$checkout" rev-parse --git-dir >/dev/null 2>&1; then
    echo "install_git_filter: $checkout is not a git checkout; no filter installed"
    exit 0
fi
if ! "$python" -m nbstripout --version >/dev/null 2>&1; then
    echo "install_git_filter: $python has no nbstripout (pip install nbstripout)" >&2
    exit 1
fi
# nbstripout's default keys plus the kernel's language_info (scripts/lab/jupyter_server_config.py strips the same)
clean="\"$python\" -m nbstripout --keep-id --extra-keys metadata.language_info"
git -C "$checkout" config filter.nbstripout.clean "$clean"
git -C "$checkout" config filter.nbstripout.smudge cat
git -C "$checkout" config diff.ipynb.textconv "$clean -t"
