"""Triton's CUDA driver with the GPU taken out, so its host path runs on a machine without one.

Installed with :func:`host_only`, it makes ``kernel[grid](...)`` do everything it does on an H200
up to the C launcher: bind and specialise the arguments, compile for the stand-in target (a real
ahead-of-time build: ptxas runs), look the kernel up, and pass through Triton's own Python launcher
wrapper, which encodes each TMA descriptor. Only the last step, the C call that would put the kernel
on a stream, is replaced: by a recorder (tests compare what two launch paths hand to it) or by
nothing (benchmarks of host cost). Device queries answer as an H200 would. Tensors stay on the CPU.

For tests and ``bench/`` only: the kernels never run here, so outputs are never computed.
"""

from __future__ import annotations

import contextlib
import hashlib
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
import triton.backends.nvidia.driver as nvdriver
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver

__all__ = ["HostOnlyDriver", "Launch", "host_only"]

#: What the C launcher received, in the installed triton's order: the base arguments (grid, stream,
#: function handle, ...) and the kernel's own arguments after descriptor expansion, with tensors
#: replaced by their data pointers and the profiler-only ones (launch metadata, hooks) by None.
Launch = tuple[Any, ...]
_PROFILER_ONLY = ("LazyDict", "HookChain")


def _plain(arg: Any) -> Any:
    if isinstance(arg, torch.Tensor):
        return arg.data_ptr()
    if isinstance(arg, (tuple, list)):
        return tuple(_plain(a) for a in arg)
    return None if type(arg).__name__ in _PROFILER_ONLY else arg


class _Utils:
    def __init__(self, sms: int, launch: Callable[..., None]) -> None:
        self.sms = sms
        self.launch = launch  # the C launch function of tritons after 3.6

    def get_device_properties(self, device: int) -> dict[str, int]:
        return {"max_shared_mem": 232448, "multiprocessor_count": self.sms, "max_num_regs": 65536,
                "warpSize": 32, "sm_clock_rate": 1980000, "mem_clock_rate": 2619000, "mem_bus_width": 6144}

    def build_signature_metadata(self, signature: list[str]) -> tuple[str, ...]:
        return tuple(signature)

    def load_binary(self, name: str, kernel: bytes, shared: int, device: int) -> tuple[Any, ...]:
        # The "function handle" names the binary: two launches share it only if they share code.
        return object(), f"{name}:{hashlib.sha1(kernel).hexdigest()[:16]}", 0, 0, 1024

    def unload_module(self, module: Any) -> None:  # later tritons unload a kernel's module on deletion
        pass

    def fill_tma_descriptor(self, ptr: int, swizzle: int, elem_size: int, elem_type: int,
                            block: list[int], shape: list[int], strides: list[int], padding: int) -> tuple:
        # The real one encodes a CUtensorMap from exactly these values; equal inputs, equal map.
        return ("tma", ptr, swizzle, elem_size, elem_type, tuple(block), tuple(shape), tuple(strides),
                padding)

    fill_tma_descriptor_tiled = fill_tma_descriptor  # its name in later tritons


class HostOnlyDriver:
    """Answers Triton's driver queries as one sm_90 device would; see the module docstring."""

    def __init__(self, target: GPUTarget | None = None, sms: int = 132,
                 launch: Callable[..., None] | None = None) -> None:
        self.target = target or GPUTarget("cuda", 90, 32)
        self.launches: list[Launch] = []
        self._launch = launch if launch is not None else self._record
        self.utils = _Utils(sms, self._launch)
        fake_module = types.SimpleNamespace(launch=self._launch)

        class Launcher(nvdriver.CudaLauncher):
            """Triton's own CudaLauncher, its Python wrapper included; only the C parts are ours.
            (triton 3.6 compiles a C module per kernel, linking libcuda: here that module is a
            stand-in. Later tritons take the driver's ``utils.launch``, which is ours already, and
            describe arguments with types from their C utils module, which stand-ins replace.)"""

            def __init__(self, src: Any, metadata: Any) -> None:
                stand_ins = {"compile_module_from_src": lambda *a, **k: fake_module, "library_dirs": lambda: [],
                             "PyKernelArg": lambda nested_tuple, type: ("arg", type, nested_tuple),
                             "ARG_CONSTEXPR": "constexpr", "ARG_KERNEL": "kernel", "ARG_TUPLE": "tuple"}
                # only what this triton has; the argument types only while its C module is not loaded
                names = [n for n in stand_ins if hasattr(nvdriver, n)
                         and (n in ("compile_module_from_src", "library_dirs") or getattr(nvdriver, n) is None)]
                saved = {n: getattr(nvdriver, n) for n in names}
                try:
                    for n in names:
                        setattr(nvdriver, n, stand_ins[n])
                    super().__init__(src, metadata)
                finally:
                    for n, v in saved.items():
                        setattr(nvdriver, n, v)

        self.launcher_cls = Launcher

    def _record(self, *args: Any) -> None:
        self.launches.append(_plain(args))

    def get_current_target(self) -> GPUTarget:
        return self.target

    def get_current_device(self) -> int:
        return 0

    def set_current_device(self, device: int) -> None:
        if device != 0:
            raise RuntimeError(f"the host-only driver has one device, 0; asked for {device}")

    def get_current_stream(self, device: int) -> int:
        return 0

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")

    def map_python_to_cpp_type(self, ty: str) -> str:  # pragma: no cover - only for C launchers
        raise NotImplementedError

    def get_benchmarker(self) -> Any:  # pragma: no cover - never benchmarks
        raise NotImplementedError


@contextlib.contextmanager
def host_only(drv: HostOnlyDriver | None = None) -> Iterator[HostOnlyDriver]:
    """Make ``drv`` Triton's active driver for the block; the previous one (or none) comes back after."""
    drv = drv or HostOnlyDriver()
    saved = driver._active
    driver.set_active(drv)  # type: ignore[arg-type]
    try:
        yield drv
    finally:
        driver._active = saved
