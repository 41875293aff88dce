"""GPU telemetry during a benchmark: NVML sampled in a background thread, summarised per time window."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

PCIE_SPILL_BYTES_S = 2e9  # a decode window moving more than this over PCIe is reading KV or weights from host


@dataclass(frozen=True)
class Sample:
    t: float  # perf_counter seconds
    power_w: float
    sm_mhz: float
    mem_mhz: float
    temp_c: float
    util_gpu: float
    util_mem: float
    pcie_rx: float  # bytes/s
    pcie_tx: float


def _nvml():
    import pynvml

    pynvml.nvmlInit()
    return pynvml


class Telemetry:
    """Samples GPU `index` every `interval` s while running; `available` is False without a GPU (no NVML)."""

    def __init__(self, index: int = 0, interval: float = 0.1, nvml=None):
        self.samples: list[Sample] = []
        self.environment: dict = {}
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            self.nvml = nvml or _nvml()
            self.handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as e:  # noqa: BLE001 - no driver / no GPU: benchmark without telemetry
            self.nvml, self.handle = None, None
            self.environment = {"gpu": None, "reason": f"no GPU telemetry ({e})"}
            return
        n = self.nvml
        name = n.nvmlDeviceGetName(self.handle)
        driver = n.nvmlSystemGetDriverVersion()
        self.environment = {
            "gpu": name.decode() if isinstance(name, bytes) else name,
            "driver": driver.decode() if isinstance(driver, bytes) else driver,
            "power_limit_w": n.nvmlDeviceGetEnforcedPowerLimit(self.handle) / 1000,
            "memory_total_bytes": n.nvmlDeviceGetMemoryInfo(self.handle).total,
        }

    @property
    def available(self) -> bool:
        return self.handle is not None

    def sample(self) -> Sample:
        n, h = self.nvml, self.handle
        util = n.nvmlDeviceGetUtilizationRates(h)
        return Sample(
            time.perf_counter(),
            n.nvmlDeviceGetPowerUsage(h) / 1000,
            n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
            n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM),
            n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
            util.gpu,
            util.memory,
            n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_RX_BYTES) * 1024,  # NVML reports KB/s
            n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_TX_BYTES) * 1024,
        )

    def __enter__(self) -> Telemetry:
        if self.available:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.sample())
            self._stop.wait(self.interval)

    def window(self, t0: float, t1: float) -> dict | None:
        """Summary of the samples in [t0, t1] (None when there are none)."""
        got = [s for s in self.samples if t0 <= s.t <= t1]
        if not got:
            return None

        def avg(key: str) -> float:
            return sum(getattr(s, key) for s in got) / len(got)

        out = {
            "samples": len(got),
            "power_avg_w": avg("power_w"),
            "power_max_w": max(s.power_w for s in got),
            "sm_mhz_avg": avg("sm_mhz"),
            "sm_mhz_min": min(s.sm_mhz for s in got),
            "sm_mhz_max": max(s.sm_mhz for s in got),
            "mem_mhz_avg": avg("mem_mhz"),
            "temp_c_max": max(s.temp_c for s in got),
            "util_gpu_avg": avg("util_gpu"),
            "util_mem_avg": avg("util_mem"),
            "pcie_rx_avg": avg("pcie_rx"),
            "pcie_tx_avg": avg("pcie_tx"),
        }
        out["pcie_spill"] = out["pcie_rx_avg"] + out["pcie_tx_avg"] > PCIE_SPILL_BYTES_S
        return out
