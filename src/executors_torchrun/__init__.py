"""torchrun executor: ranks as torch.distributed processes (filled in by the torchrun issue)."""
