-- Hardware utilization per host, GPU and PM sampling metric over a span, from the collector's
-- pm_stats, as `cuptistream summary`'s hw_utilization table.
-- Parameters: job String ('' for every job), since and until DateTime64(9, 'UTC') (by interval start).
-- mean: the intervals' means weighted by their samples (the mean over the samples); p95: the highest
-- interval p95 (a burst stays visible however long the span). Values in the metric's own unit:
-- % of peak for *.pct_of_peak_*, bytes per second for *.per_second. Intervals without a value for a
-- metric (null: CUPTI could not evaluate it) are left out of that metric's figures.
SELECT
    host,
    device_uuid,
    device_id,
    metric,
    count() AS intervals,
    sum(pm_stats.samples) AS samples,
    sum(mean_value * pm_stats.samples) / sum(pm_stats.samples) AS mean,
    max(p95_value) AS p95
FROM pm_stats
ARRAY JOIN pm_stats.metrics AS metric, pm_stats.mean AS mean_value, pm_stats.p95 AS p95_value
WHERE interval_start >= {since:DateTime64(9, 'UTC')} AND interval_start < {until:DateTime64(9, 'UTC')}
  AND ({job:String} = '' OR job = {job:String})
  AND mean_value IS NOT NULL
GROUP BY host, device_uuid, device_id, metric
ORDER BY host, device_id, metric
