"""Exceptions: one scalemm.Error subclass per library status code.

Each carries the library's status name (``status``, e.g. "SCALEMM_STATUS_INVALID_LAYOUT") and its full
message (``message``: the argument, the rule, expected and actual values, the fix). The subclasses
also derive from the matching built-in exception, so ``except ValueError`` keeps working in callers
that know nothing of scalemm.
"""

from __future__ import annotations


class Error(Exception):
    """Base class of every error scalemm raises."""

    status = "SCALEMM_STATUS_UNKNOWN"
    code = -1

    def __init__(self, message: str, status: str | None = None):
        super().__init__(f"{status or type(self).status}: {message}")
        self.message = message
        if status is not None:
            self.status = status


class InvalidArgumentError(Error, ValueError):
    status, code = "SCALEMM_STATUS_INVALID_ARGUMENT", 1


class InvalidLayoutError(Error, ValueError):
    status, code = "SCALEMM_STATUS_INVALID_LAYOUT", 2


class UnsupportedError(Error, RuntimeError):
    status, code = "SCALEMM_STATUS_UNSUPPORTED", 3


class CudaError(Error, RuntimeError):
    status, code = "SCALEMM_STATUS_CUDA_ERROR", 4


class CublasError(Error, RuntimeError):
    status, code = "SCALEMM_STATUS_CUBLAS_ERROR", 5


class OutOfMemoryError(Error, MemoryError):
    status, code = "SCALEMM_STATUS_OUT_OF_MEMORY", 6


class VerificationFailedError(Error, RuntimeError):
    status, code = "SCALEMM_STATUS_VERIFICATION_FAILED", 7


class IoError(Error, OSError):
    status, code = "SCALEMM_STATUS_IO_ERROR", 8


class InternalError(Error, RuntimeError):
    status, code = "SCALEMM_STATUS_INTERNAL", 9


class GroupedGemmNotImplementedError(UnsupportedError, NotImplementedError):
    """No longer raised: scaled_grouped_mm runs grouped GEMMs. Kept so that code importing it (or
    catching it around scaled_grouped_mm) keeps working."""


BY_CODE = [None, InvalidArgumentError, InvalidLayoutError, UnsupportedError, CudaError, CublasError,
           OutOfMemoryError, VerificationFailedError, IoError, InternalError]


def invalid(argument: str, what: str, expected: str, actual: str, fix: str = "") -> InvalidArgumentError:
    """An InvalidArgumentError worded like the library's diagnostics."""
    text = f"{argument}: {what}: expected {expected}, got {actual}."
    if fix:
        text += f" {fix}"
    return InvalidArgumentError(text)
