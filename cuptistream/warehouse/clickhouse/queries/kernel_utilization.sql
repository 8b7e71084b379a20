-- Hardware utilization per host, GPU, kernel name and PM sampling metric over a span, from the
-- collector's pm_kernel_stats (the counters of the samples each kernel name ran in), as
-- `cuptistream summary`'s kernel_hw_utilization table.
-- Parameters: job String ('' for every job), since and until DateTime64(9, 'UTC') (by interval start).
-- mean: the intervals' means weighted by their covered kernel time (the overlap-weighted mean over
-- every sample the name's kernels ran in); intervals without a value for the metric (null: CUPTI
-- could not evaluate it) are left out of its mean. kernel_ns: the name's kernel time in those
-- intervals; covered_share: the part of it that samples covered. Names as recorded (mangled).
SELECT
    host,
    device_uuid,
    device_id,
    name,
    metric,
    count() AS intervals,
    sum(pm_kernel_stats.samples) AS samples,
    sum(pm_kernel_stats.kernel_ns) AS kernel_ns,
    sum(pm_kernel_stats.covered_ns) AS covered_ns,
    covered_ns / kernel_ns AS covered_share,
    sum(pm_kernel_stats.own_share * pm_kernel_stats.covered_ns) / covered_ns AS own_share,
    sumIf(mean_value * pm_kernel_stats.covered_ns, mean_value IS NOT NULL)
        / sumIf(pm_kernel_stats.covered_ns, mean_value IS NOT NULL) AS mean
FROM pm_kernel_stats
ARRAY JOIN pm_kernel_stats.metrics AS metric, pm_kernel_stats.mean AS mean_value
WHERE interval_start >= {since:DateTime64(9, 'UTC')} AND interval_start < {until:DateTime64(9, 'UTC')}
  AND ({job:String} = '' OR job = {job:String})
GROUP BY host, device_uuid, device_id, name, metric
ORDER BY host, device_id, kernel_ns DESC, name, metric
