# One-off measurement script (2026-11-28, fifth session); run from the checkout root. Results in docs/benchmarks.md.
import sys, time
sys.path.insert(0,'bench')
from zstd_levels import payload, W3
import zstandard as z
data, n = payload(W3)
B=4<<20
chunks = [data[i:i+B] for i in range(0, len(data)-B, B)] * 5
tot=sum(map(len,chunks))
base = z.ZstdCompressionParameters.from_level(1)
print('level1 params', base.window_log, base.chain_log, base.hash_log, base.search_log, base.min_match, base.target_length, base.strategy)
cands = {'L1': dict(level=1), 'L-1': dict(level=-1), 'L2': dict(level=2)}
for wl in (17,19,22):
    for hl in (14,16,17):
        for mm in (5,6,7):
            cands[f'w{wl}h{hl}m{mm}'] = dict(params=z.ZstdCompressionParameters(window_log=wl, hash_log=hl, chain_log=16, search_log=1, min_match=mm, target_length=0, strategy=z.STRATEGY_FAST, write_content_size=True, write_checksum=True))
res={}
for rep in range(3):
    for k,v in cands.items():
        c = z.ZstdCompressor(compression_params=v['params']) if 'params' in v else z.ZstdCompressor(level=v['level'], write_content_size=True, write_checksum=True)
        p0=time.process_time(); out=sum(len(c.compress(x)) for x in chunks); cpu=time.process_time()-p0
        res.setdefault(k,[]).append((tot/cpu/1e9, tot/out))
for k,v in sorted(res.items(), key=lambda kv: -sorted(x[0] for x in kv[1])[1]):
    sp=sorted(x[0] for x in v)
    print(f"{k:12} {sp[1]:.2f} GB/s [{sp[0]:.2f}..{sp[2]:.2f}] ratio {v[0][1]:.1f}")
