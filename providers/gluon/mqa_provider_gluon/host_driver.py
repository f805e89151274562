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
from collections.abc import Callable, Iterator
from typing import Any

import torch
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.driver import CudaLauncher, wrap_handle_tensordesc
from triton.runtime.driver import driver

__all__ = ["HostOnlyDriver", "Launch", "host_only"]

#: What the C launcher received: the base arguments (grid, stream, function handle, ...) and the
#: kernel's own arguments after descriptor expansion, with tensors replaced by their data pointers.
Launch = tuple[Any, ...]


def _plain(arg: Any) -> Any:
    return arg.data_ptr() if isinstance(arg, torch.Tensor) else arg


class _Utils:
    def __init__(self, sms: int) -> None:
        self.sms = sms

    def get_device_properties(self, device: int) -> dict[str, int]:
        return {"max_shared_mem": 232448, "multiprocessor_count": self.sms, "max_num_regs": 65536,
                "warpSize": 32, "sm_clock_rate": 1980000, "mem_clock_rate": 2619000, "mem_bus_width": 6144}

    def load_binary(self, name: str, kernel: bytes, shared: int, device: int) -> tuple[Any, ...]:
        # The "function handle" names the binary: two launches share it only if they share code.
        return object(), f"{name}:{hashlib.sha1(kernel).hexdigest()[:16]}", 0, 0, 1024

    def fill_tma_descriptor(self, ptr: int, swizzle: int, elem_size: int, elem_type: int,
                            block: list[int], shape: list[int], strides: list[int], padding: int) -> tuple:
        # The real one encodes a CUtensorMap from exactly these values; equal inputs, equal map.
        return ("tma", ptr, swizzle, elem_size, elem_type, tuple(block), tuple(shape), tuple(strides),
                padding)


class HostOnlyDriver:
    """Answers Triton's driver queries as one sm_90 device would; see the module docstring."""

    def __init__(self, target: GPUTarget | None = None, sms: int = 132,
                 launch: Callable[..., None] | None = None) -> None:
        self.target = target or GPUTarget("cuda", 90, 32)
        self.utils = _Utils(sms)
        self.launches: list[Launch] = []
        self._launch = launch if launch is not None else self._record
        owner = self

        class Launcher(CudaLauncher):
            """CudaLauncher without its compiled C module: the Python wrapper is Triton's own."""

            def __init__(self, src: Any, metadata: Any) -> None:
                signature = dict(src.signature.items())
                self.launch = wrap_handle_tensordesc(owner._launch, signature,
                                                     getattr(metadata, "tensordesc_meta", None))
                self.num_ctas = getattr(metadata, "num_ctas", 1)
                self.global_scratch_size = metadata.global_scratch_size
                self.global_scratch_align = metadata.global_scratch_align
                self.profile_scratch_size = metadata.profile_scratch_size
                self.profile_scratch_align = metadata.profile_scratch_align
                self.launch_cooperative_grid = metadata.launch_cooperative_grid
                self.launch_pdl = metadata.launch_pdl

        self.launcher_cls = Launcher

    def _record(self, *args: Any) -> None:
        # args: grid x3, stream, function, cooperative, pdl, scratch x2, packed metadata, launch
        # metadata, enter hook, exit hook, then the kernel's arguments. Hooks and launch metadata
        # are left out: they only feed profilers.
        self.launches.append(tuple(_plain(a) for a in args[:10]) + tuple(_plain(a) for a in args[13:]))

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
