# One-off measurement script (2026-11-28, fifth session); run from the checkout root. Results in docs/benchmarks.md.
import sys, time, resource
sys.path.insert(0,'bench')
from zstd_levels import payload, W3
import zstandard
data, n = payload(W3)
c = zstandard.ZstdCompressor(level=1, write_content_size=True, write_checksum=True)
for B in (4<<20, 2<<20, 1<<20, 512<<10):
    chunks = [data[i:i+B] for i in range(0, len(data), B)] * 4
    best=0
    for _ in range(3):
        r0=time.process_time(); out=sum(len(c.compress(x)) for x in chunks); cpu=time.process_time()-r0
        tot=sum(map(len,chunks)); best=max(best, tot/cpu/1e9)
    print(B>>10, 'KiB', f"cpu {best:.2f} GB/s ratio {tot/out:.1f}")
