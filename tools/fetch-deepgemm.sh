#!/usr/bin/env bash
# Stages DeepGEMM's source (the benchmark anchor of python/benchmarks/grouped.py) in .deps/deepgemm,
# git-ignored, for a GPU machine without network; tools/build-deepgemm.sh builds it there.
#   tools/fetch-deepgemm.sh                    clone from GitHub at the pinned commits
#   tools/fetch-deepgemm.sh DEEPGEMM_GIT FMT_GIT   the same from local clones (any checkout of each)
# Pinned: DeepGEMM v2.6.1 (the last with the sm_90 FP8 kernels) and its fmt submodule. Its CUTLASS
# submodule is not staged: the build takes CUTLASS's headers from .deps/cutlass (tools/fetch-cutlass.sh;
# DeepGEMM's kernels use CuTe and CUTLASS primitives only). About 8 MB.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest=$root/.deps/deepgemm
deepgemm_commit=54e22612409371d6364144b69086735beb54e98b
fmt_commit=553ec11ec06fbe0beebfbb45f9dc3c9eabd83d28
src_dg=${1:-https://github.com/deepseek-ai/DeepGEMM.git}
src_fmt=${2:-https://github.com/fmtlib/fmt.git}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# A bare copy of `repo` at `commit`, without history: git archive of a clone.
export_at() {
  local repo=$1 commit=$2 out=$3
  git clone -q --no-checkout "$repo" "$tmp/clone" ||
    { echo "fetch-deepgemm: could not clone $repo" >&2; exit 1; }
  git -C "$tmp/clone" cat-file -e "$commit^{commit}" 2>/dev/null ||
    { echo "fetch-deepgemm: $repo has no commit $commit" >&2; exit 1; }
  mkdir -p "$out"
  git -C "$tmp/clone" archive "$commit" | tar -x -C "$out"
  rm -rf "$tmp/clone"
}

rm -rf "$dest"
export_at "$src_dg" "$deepgemm_commit" "$dest"
export_at "$src_fmt" "$fmt_commit" "$tmp/fmt"
mkdir -p "$dest/third-party/fmt"
cp -r "$tmp/fmt/include" "$dest/third-party/fmt/"
rm -rf "$dest/tests" "$dest/.github" "$dest/figures"
echo "$deepgemm_commit" > "$dest/COMMIT"
echo "fetch-deepgemm: DeepGEMM ${deepgemm_commit:0:7} in $dest ($(du -sh "$dest" | cut -f1)); build it on the GPU machine with tools/build-deepgemm.sh"
