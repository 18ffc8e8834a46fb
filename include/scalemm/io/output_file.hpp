// Safe output files: every file scalemm writes (CLI outputs, verify dumps, renders, benchmark
// results) goes through these two functions, so that a bad output path is refused by name before any
// work and a good one is never half-written.
//
// Rules (docs/reliability.md, "Output files"):
// - the output is written to a unique temporary file in the target's folder (mkstemp: O_CREAT|O_EXCL,
//   so no existing file of the user's is ever reused) and renamed over the target when complete;
// - a symlink is written through: its final target is replaced, the link itself stays;
//   a dangling symlink is refused by name;
// - device nodes, FIFOs, sockets and folders are refused, never replaced;
// - an output that is the same file (st_dev and st_ino) as one of the inputs is refused;
// - pseudo-filesystems (/proc, /sys) and folders where no file can be created are refused.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace scalemm::io {

/// Checks that `path` can be written as described above, without creating anything that stays.
/// `option` names the argument in errors ("--out"); `inputs` are the paths the command reads (those
/// that do not exist are ignored here: reading them fails later with its own error).
/// Returns the path that will be replaced (a symlink's final target, or `path`).
/// Throws Error(kIoError) "<option>: cannot write <path>: <why>; <fix>".
std::string check_output(const std::string& path, std::string_view option = "output",
                         const std::vector<std::string>& inputs = {});

/// Writes the concatenation of `parts` to `path` atomically (check_output, then a unique temporary
/// file beside the target, fsync, rename). An existing file keeps its permission bits; a new one gets
/// 0666 & ~umask. Throws Error(kIoError); on failure the temporary file is removed and `path` is untouched.
void write_output(const std::string& path, const std::vector<std::string_view>& parts,
                  std::string_view option = "output");

}  // namespace scalemm::io
