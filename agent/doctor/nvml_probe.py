"""NVIDIA GPUs through NVML: the library, the driver, the GPU count, or NVML's own error."""

from __future__ import annotations

from .report import Item, fail, ok


def probe() -> list[Item]:
    try:
        import pynvml
    except ImportError as exc:
        return [fail("nvml", f"python module pynvml (nvidia-ml-py) not installed: {exc}")]
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return [fail("nvml", f"{type(exc).__name__}: {exc}")]
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        count = pynvml.nvmlDeviceGetCount()
        return [
            ok("nvml", driver=_text(driver), cuda=f"{cuda // 1000}.{cuda % 1000 // 10}", gpus=count)
        ]
    except pynvml.NVMLError as exc:
        return [fail("nvml", f"{type(exc).__name__}: {exc}")]
    finally:
        pynvml.nvmlShutdown()


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
