"""Optional libraries imported at the top of a module, and their absence reported when used (Optuna's
``optuna._imports.try_import`` pattern).

    from archspec._util.imports import try_import

    with try_import() as _onnx:        # at the top of the module: no function-local import
        import onnx

    def check(path):
        _onnx.check()                  # ImportError naming the missing library and the extra that installs it
        onnx.load(path)

A library in an extra (``pip install 'archspec[export]'``) is imported this way; a function-local import
elsewhere outside :mod:`archspec.cli` carries ``# noqa: PLC0415 - <why>`` (tests/test_layers.py counts them).
"""

from __future__ import annotations

from types import TracebackType

__all__ = ["try_import"]


class _DeferredImport:
    """The context manager :func:`try_import` returns: it swallows an ``ImportError`` inside its ``with`` block
    and raises it again, with the install hint, at :meth:`check`."""

    def __init__(self, extra: str | None) -> None:
        self._extra = extra
        self._error: ImportError | None = None

    def __enter__(self) -> _DeferredImport:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        if isinstance(exc, ImportError):
            self._error = exc
            return True
        return False

    def is_successful(self) -> bool:
        """Whether every import of the block succeeded."""
        return self._error is None

    def check(self) -> None:
        """Raise the deferred ``ImportError`` (naming the extra to install), if the import failed.

        Raises:
            ImportError: the library could not be imported.
        """
        if self._error is not None:
            hint = f" (pip install 'archspec[{self._extra}]')" if self._extra else ""
            raise ImportError(f"{self._error}{hint}") from self._error


def try_import(extra: str | None = None) -> _DeferredImport:
    """A context manager for importing an optional library at module level; ``extra`` names the pip extra that
    installs it."""
    return _DeferredImport(extra)
