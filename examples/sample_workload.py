"""A small GPU workload for the quick start: a few hundred kernels, copies and NVTX ranges (PyTorch)."""

from __future__ import annotations

import sys

try:
    import torch
except ImportError:
    sys.exit("sample_workload.py needs PyTorch with CUDA (pip install torch)")

if not torch.cuda.is_available():
    sys.exit("sample_workload.py: torch sees no CUDA device")

device = torch.device("cuda")
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(50):
    torch.cuda.nvtx.range_push(f"step {step}")
    x = torch.randn(64, 256).to(device)  # a host-to-device copy per step
    loss = model(x).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    torch.cuda.nvtx.range_pop()
print(f"final loss {loss.item():.4f}")
