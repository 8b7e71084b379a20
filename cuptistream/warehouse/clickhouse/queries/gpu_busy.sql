-- GPU busy and statistics coverage per host and GPU, from the collector's gpu_stats (every mode
-- with statistics on), as `cuptistream summary`'s gpu_busy table of a statistics recording.
-- Parameters: job String ('' for every job), since and until DateTime64(9, 'UTC') (by interval start).
-- busy_ns: the union of kernel, copy and memset time within the traced time; traced_ns: how long
-- kernels were traced; observed_ns: the statistics intervals' length. busy_share = busy / traced
-- (an estimate for the whole time where estimated); coverage = traced / observed (1 in full mode,
-- the budget windows' share in always-on mode).
SELECT
    host,
    device_uuid,
    device_id,
    job,
    pid,
    rank,
    count() AS intervals,
    sum(busy_ns) AS busy_ns,
    sum(traced_ns) AS traced_ns,
    sum(toUnixTimestamp64Nano(interval_end) - toUnixTimestamp64Nano(interval_start)) AS observed_ns,
    if(traced_ns > 0, busy_ns / traced_ns, 0) AS busy_share,
    if(observed_ns > 0, traced_ns / observed_ns, 0) AS coverage,
    sum(kernel_ns) AS kernel_ns,
    sum(nccl_ns) AS nccl_ns,
    sum(copy_ns) AS copy_ns,
    sum(memset_ns) AS memset_ns,
    sum(copy_bytes) AS copy_bytes,
    max(estimated) AS estimated
FROM gpu_stats
WHERE interval_start >= {since:DateTime64(9, 'UTC')} AND interval_start < {until:DateTime64(9, 'UTC')}
  AND ({job:String} = '' OR job = {job:String})
GROUP BY host, device_uuid, device_id, job, pid, rank
ORDER BY host, device_id, pid
