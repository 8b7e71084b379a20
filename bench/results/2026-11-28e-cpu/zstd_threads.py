# One-off measurement script (2026-11-28, fifth session); run from the checkout root. Results in docs/benchmarks.md.
import sys, time
sys.path.insert(0,'bench')
from zstd_levels import payload, W3
import zstandard
data, n = payload(W3)
B=4<<20
chunks = [data[i:i+B] for i in range(0, len(data)-B, B)] * 6
tot=sum(map(len,chunks))
cs={t: zstandard.ZstdCompressor(level=1, threads=t, write_content_size=True, write_checksum=True) for t in (0,2,4)}
res={t:[] for t in cs}
for rep in range(5):
    for t,c in cs.items():
        p0=time.process_time(); w0=time.perf_counter()
        out=sum(len(c.compress(x)) for x in chunks)
        res[t].append(((time.process_time()-p0), time.perf_counter()-w0, tot/out))
for t,r in res.items():
    cpu=sorted(x[0] for x in r); wall=sorted(x[1] for x in r)
    print(t, f"cpu GB/s med {tot/cpu[2]/1e9:.2f} [{tot/cpu[-1]/1e9:.2f}..{tot/cpu[0]/1e9:.2f}] wall GB/s med {tot/wall[2]/1e9:.2f} ratio {r[0][2]:.1f}")
