-- Top kernels by GPU time over a span, as `cuptistream summary`'s kernels table.
-- Parameters: job String ('' for every job), since and until DateTime64(9, 'UTC') (a kernel counts
-- when it starts in [since, until); a statistics row when its interval does), top UInt32.
-- Each process counts its raw kernel records where it has any in the span (full mode), else the
-- collector's activity_stats (always-on mode): estimated_* are scaled to whole intervals where only
-- part was traced, and equal the measured values elsewhere. Names as recorded (mangled).
WITH raw AS (
    SELECT DISTINCT job, host, pid
    FROM kernel
    WHERE start >= {since:DateTime64(9, 'UTC')} AND start < {until:DateTime64(9, 'UTC')}
      AND ({job:String} = '' OR job = {job:String})
)
SELECT
    name,
    sum(launches) AS count,
    sum(gpu_ns) AS total_ns,
    sum(estimated_launches) AS estimated_count,
    sum(estimated_gpu_ns) AS estimated_total_ns,
    estimated_total_ns / sum(estimated_total_ns) OVER () AS share,
    max(scaled) AS estimated,
    uniqExact(job) AS jobs,
    uniqExact(host, pid) AS processes
FROM (
    SELECT name, job, host, pid, toInt64(count()) AS launches, sum(duration_ns) AS gpu_ns,
           launches AS estimated_launches, gpu_ns AS estimated_gpu_ns, false AS scaled
    FROM kernel
    WHERE start >= {since:DateTime64(9, 'UTC')} AND start < {until:DateTime64(9, 'UTC')}
      AND ({job:String} = '' OR job = {job:String})
    GROUP BY name, job, host, pid
    UNION ALL
    SELECT name, job, host, pid, sum(`count`), sum(total_ns), sum(estimated_count), sum(estimated_total_ns),
           max(estimated)
    FROM activity_stats
    WHERE category = 'kernel'
      AND interval_start >= {since:DateTime64(9, 'UTC')} AND interval_start < {until:DateTime64(9, 'UTC')}
      AND ({job:String} = '' OR job = {job:String})
      AND (job, host, pid) NOT IN raw
    GROUP BY name, job, host, pid
)
GROUP BY name
ORDER BY estimated_total_ns DESC, name
LIMIT {top:UInt32}
