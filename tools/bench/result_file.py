"""Result files of the benchmark scripts, written as the library writes its outputs (io::write_output,
docs/reliability.md "Output files"): through a symlink to its target, never over a device, FIFO,
socket or folder, atomically through a unique temporary file beside the target."""

import os
import stat
import tempfile


def check_result_path(path: str) -> str:
    """The file `path` will replace (a symlink's target); SystemExit naming the path when it cannot be one."""
    real = os.path.realpath(path)
    if os.path.lexists(path) and not os.path.exists(real):
        raise SystemExit(f"{path}: a symlink whose target does not exist; point it at a file or remove it")
    if os.path.exists(real) and not stat.S_ISREG(os.stat(real).st_mode):
        raise SystemExit(f"{path}: not a regular file (a folder, device, FIFO or socket); choose a file path")
    folder = os.path.dirname(real) or "."
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise SystemExit(f"{path}: the folder {folder} does not exist or is not writable; choose another path")
    return real


def write_result(path: str, text: str) -> None:
    real = check_result_path(path)
    mode = stat.S_IMODE(os.stat(real).st_mode) if os.path.exists(real) else None
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(real) or ".", prefix="." + os.path.basename(real) + ".")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if mode is None:
            mask = os.umask(0)
            os.umask(mask)
            mode = 0o666 & ~mask
        os.chmod(tmp, mode)
        os.replace(tmp, real)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
