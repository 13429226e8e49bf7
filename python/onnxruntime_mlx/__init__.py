"""The MLX execution provider for ONNX Runtime, as a Python package.

Register the plugin once per process and select it for a session::

    import onnxruntime as ort
    import onnxruntime_mlx

    session = ort.InferenceSession("model.onnx", onnxruntime_mlx.session_options())

Nodes the MLX EP cannot run stay on ONNX Runtime's CPU EP. The package does not depend on the
``onnxruntime`` distribution (``onnxruntime``, ``onnxruntime-gpu`` or another build all work);
it needs ONNX Runtime 1.31 or newer, which :func:`register_execution_provider_library` checks.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Dict, List, Optional

__all__ = [
    "EP_NAME",
    "MIN_ORT_VERSION",
    "append_to_session_options",
    "ep_name",
    "library_path",
    "register_execution_provider_library",
    "session_options",
    "version",
]

__version__ = "0.1.0"

#: The name ONNX Runtime knows the execution provider by.
EP_NAME = "MLXExecutionProvider"

#: The oldest ONNX Runtime the plugin works with (its C API version 31).
MIN_ORT_VERSION = (1, 31)

#: The name the library is registered under.
REGISTRATION_NAME = "MLX"

_lock = threading.Lock()
_registered = False


def version() -> str:
    """The version of this package and of the plugin library it holds."""
    return __version__


def ep_name() -> str:
    """``"MLXExecutionProvider"``."""
    return EP_NAME


def library_path() -> str:
    """The absolute path of the plugin library shipped in this package."""
    name = "libonnxruntime_mlx_ep.dylib" if sys.platform == "darwin" else "libonnxruntime_mlx_ep.so"
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"the MLX EP plugin library is missing from the package: {path}")
    return path


def _ort_version(ort: Any) -> tuple:
    parts = []
    for piece in ort.__version__.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def register_execution_provider_library(ort: Optional[Any] = None) -> None:
    """Registers the plugin with ONNX Runtime, once per process (later calls do nothing).

    Raises ``RuntimeError`` when the installed ONNX Runtime is older than 1.31.
    """
    global _registered
    if ort is None:
        import onnxruntime as ort  # noqa: PLC0415 - imported lazily: the package does not require it
    with _lock:
        if _registered:
            return
        if _ort_version(ort) < MIN_ORT_VERSION:
            raise RuntimeError(
                f"onnxruntime {ort.__version__} is too old for the MLX execution provider: "
                f"it needs {MIN_ORT_VERSION[0]}.{MIN_ORT_VERSION[1]} or newer"
            )
        ort.register_execution_provider_library(REGISTRATION_NAME, library_path())
        _registered = True


def _mlx_devices(ort: Any) -> List[Any]:
    return [d for d in ort.get_ep_devices() if d.ep_name == EP_NAME]


def append_to_session_options(so: Any, provider_options: Optional[Dict[str, str]] = None) -> Any:
    """Selects the MLX EP's devices on ``so`` (registering the plugin first if needed).

    Nodes the MLX EP does not take run on ONNX Runtime's CPU EP. When no MLX device is
    available, ``so`` is left as it is (everything runs on the CPU EP). Returns ``so``.
    """
    import onnxruntime as ort  # noqa: PLC0415

    register_execution_provider_library(ort)
    devices = _mlx_devices(ort)
    if devices:
        so.add_provider_for_devices(devices, dict(provider_options or {}))
    return so


def session_options(provider_options: Optional[Dict[str, str]] = None, **config: str) -> Any:
    """New ``onnxruntime.SessionOptions`` with the MLX EP selected.

    Keyword arguments become session config entries, e.g.
    ``session_options(**{"session.record_ep_graph_assignment_info": "1"})``.
    """
    import onnxruntime as ort  # noqa: PLC0415

    so = ort.SessionOptions()
    for key, value in config.items():
        so.add_session_config_entry(key, value)
    return append_to_session_options(so, provider_options)
