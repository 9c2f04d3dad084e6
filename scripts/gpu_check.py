"""Every GPU path a one-GPU machine can exercise, each a few seconds (run by ``scripts/gpu_check.sh``).

Reached here:
  * local calls: CUDA tensors arrive on the rank's current device;
  * weight sync between local groups from CUDA sources (the pieces are
    assembled on CPU, as documented; ``load_weights`` puts them on the GPU);
  * Ray ``num_gpus=0.5``: two actors share the one GPU (fractional
    placement), see it as their device, and get CUDA arguments on it;
  * torchrun (self-started) with the user's own gloo group all-reducing
    CUDA tensors inside the workers (``LOCAL_RANK`` device set first).
Not reachable with one GPU (NCCL refuses two ranks on one device): NCCL
between two ranks (torchrun's CUDA payloads, CUDA lazy rows, the weight
bridge's ``ProcessGroupNCCL``, which torchrun and Ray share).  Their CPU twins (gloo, the
same code with CPU tensors) run in the CPU test suite:
``tests/test_torchrun_bridge.py``, ``tests/test_torchrun_conformance.py``,
``tests/test_weight_sync.py``.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist

from dispatchcore import Dispatch, WeightSync, Worker, WorkerGroup, register


class Echo(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def where(self, t: torch.Tensor) -> tuple[str, int]:
        return str(t.device), torch.cuda.current_device()

    @register(Dispatch.ONE_TO_ALL)
    def gpu_ids(self) -> list[int]:
        import ray

        return [int(i) for i in ray.get_gpu_ids()]

    @register(Dispatch.ONE_TO_ALL)
    def gloo_allreduce(self, port: int) -> float:
        if not dist.is_initialized():
            dist.init_process_group("gloo")  # the user's own default group (the executor set its env)
        t = torch.ones(4, device="cuda") * (self.rank + 1)
        dist.all_reduce(t)
        return float(t[0].item())


class CudaTrainer(Worker):
    def weights(self) -> dict[str, torch.Tensor]:
        return {"w": torch.arange(12.0, device="cuda").reshape(3, 4)}


class CudaRollout(Worker):
    def __init__(self) -> None:
        self.w = torch.zeros(3, 4, device="cuda")

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        for _, t in weights:
            self.w.copy_(t)

    @register(Dispatch.ONE_TO_ALL)
    def read(self) -> list[float]:
        return self.w.reshape(-1).tolist()


def check(name: str, fn: object) -> bool:
    start = time.monotonic()
    try:
        fn()  # type: ignore[operator]
    except Exception as exc:  # noqa: BLE001 - reported, the next check still runs
        print(f"FAIL {name}: {type(exc).__name__}: {exc}")
        return False
    print(f"ok   {name} ({time.monotonic() - start:.1f} s)")
    return True


def local_calls() -> None:
    with WorkerGroup(Echo, 2, backend="local") as wg:
        for device, current in wg.where(torch.ones(3, device="cuda")):
            assert device == f"cuda:{current}", (device, current)


def local_weight_sync() -> None:
    with WorkerGroup(CudaTrainer, 1, backend="local") as src, WorkerGroup(CudaRollout, 2, backend="local") as dst:
        WeightSync(src, dst)(version=1)
        assert dst.read() == [list(map(float, range(12)))] * 2


def ray_fractional() -> None:
    import ray

    ray.init(include_dashboard=False, log_to_driver=False, num_gpus=1)
    try:
        with WorkerGroup(Echo, 2, backend="ray", num_gpus=0.5) as wg:
            assert wg.gpu_ids() == [[0], [0]], wg.gpu_ids()
            for device, current in wg.where(torch.ones(3, device="cuda")):
                assert device == f"cuda:{current}", (device, current)
    finally:
        ray.shutdown()


def torchrun_gloo_cuda() -> None:
    with WorkerGroup(Echo, 2, backend="torchrun") as wg:
        assert wg.gloo_allreduce(0) == [3.0, 3.0]


def main() -> int:
    if not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device here (torch.cuda.is_available() is False); nothing to check. "
            "The same code paths run on CPU in the test suite."
        )
        return 0
    print(f"gpu_check: {torch.cuda.device_count()} GPU(s), {torch.cuda.get_device_name(0)}")
    print("not reachable with one GPU: NCCL between two ranks (torchrun CUDA payloads, lazy rows, weight bridge)")
    results = [
        check("local calls: CUDA tensors on the current device", local_calls),
        check("local weight sync from CUDA sources", local_weight_sync),
        check("ray num_gpus=0.5: two actors on one GPU, CUDA arguments", ray_fractional),
        check("torchrun: the user's gloo group with CUDA tensors", torchrun_gloo_cuda),
    ]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
