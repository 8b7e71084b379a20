-- Slow ranks: the rule of `cuptistream compare` (docs/analysis.md, "The rule") for one job, or for
-- every job in a span. One row per flag over the whole span: the rank, the metric, how far from the
-- median rank (or, of two ranks, from its peer), and the kernels that take longer and shorter on it.
-- Parameters: job String ('' for every job), since and until DateTime64(9, 'UTC') (GPU work that
-- starts in [since, until); a statistics row whose interval does), interval_s UInt32 (compare's
-- --interval, 10), top UInt32 (kernels listed per flagged rank, compare's 5).
--
-- As compare: ranks are `rank`, or 'pid P@host' for a process without one (left out where other
-- processes of the job carry a rank); a rank is compared on its raw kernel, copy and memset records
-- where it has any, else on its statistics (activity_stats and gpu_stats, their estimated_* values;
-- busy scaled as the kernel rows of its interval and GPU); a kernel (or a CUDA graph launch) counts
-- in the interval it starts in, busy time (the union of kernels, copies and memsets) is split at
-- interval edges, busy_fraction is over the span of every rank's GPU work in the interval; a rank on
-- statistics with gaps has its whole-span totals scaled over them. Per metric across the ranks:
-- z = (x - median) / (1.4826 * MAD), flagged when |z| > 3.5 (or MAD = 0) and |x - median| >= 2 % of
-- the median (15 % for the kernel and byte counts of estimated ranks); two ranks: the one with 2 %
-- more compute time and no more NCCL time; one rank: nothing. A rank on estimates is flagged over
-- the whole span only where it was also flagged in at least half of the intervals it was compared in.
-- Differences from compare: a rank on raw records is compared in every interval from its first
-- work on (compare decides with what it has read when the interval closes); ranks that share a GPU
-- are compared on their measured kernel time, not compare's work basis.
-- Each step below reads the one before it once, so ClickHouse plans it as one pipeline. Raw records
-- are aggregated per rank, interval and kernel name before any window function, and busy time is
-- the union of the pieces (intervalLengthSum), so memory grows with the records' pieces (16 bytes
-- each, for the union) and not with whole rows: every job of a fleet at once runs as one job does.
WITH
    3.5 AS threshold,
    0.02 AS min_relative,
    0.15 AS estimate_tolerance,
    3 AS min_ranks,
    1.4826 AS mad_scale,
    toInt64({interval_s:UInt32}) * 1000000000 AS iv_ns,
    toInt64(3600000000000) AS max_op_ns,  -- one operation's time is cut to an hour (a corrupt end)
records AS (  -- raw GPU work in the span, Unix ns: kind 'k'ernel (a graph launch is a kernel), 'c'opy, 'm'emset
    SELECT job, if(rank IS NULL, concat('pid ', toString(pid), '@', host), concat('rank ', toString(rank))) AS label,
           kind, name, a, b, ns, n, nbytes
    FROM (
        SELECT job, host, pid, rank, 'k' AS kind, toString(name) AS name, toUnixTimestamp64Nano(start) AS a,
               least(greatest(duration_ns, 0), max_op_ns) AS ns, a + ns AS b, toInt64(1) AS n, toInt64(0) AS nbytes
        FROM kernel
        WHERE start >= {since:DateTime64(9, 'UTC')} AND start < {until:DateTime64(9, 'UTC')}
              AND ({job:String} = '' OR job = {job:String})
        UNION ALL
        SELECT job, host, pid, rank, 'k', concat('CUDA graph ', toString(graph_id)), toUnixTimestamp64Nano(start),
               least(greatest(duration_ns, 0), max_op_ns), toUnixTimestamp64Nano(start) + least(greatest(duration_ns, 0), max_op_ns),
               1, 0
        FROM graph_launch
        WHERE start >= {since:DateTime64(9, 'UTC')} AND start < {until:DateTime64(9, 'UTC')}
              AND ({job:String} = '' OR job = {job:String})
        UNION ALL
        SELECT job, host, pid, rank, 'c', '', toUnixTimestamp64Nano(start), least(greatest(duration_ns, 0), max_op_ns),
               toUnixTimestamp64Nano(start) + least(greatest(duration_ns, 0), max_op_ns), 1, `bytes`
        FROM memcpy
        WHERE start >= {since:DateTime64(9, 'UTC')} AND start < {until:DateTime64(9, 'UTC')}
              AND ({job:String} = '' OR job = {job:String})
        UNION ALL
        SELECT job, host, pid, rank, 'm', '', toUnixTimestamp64Nano(start), 0,
               toUnixTimestamp64Nano(start) + least(greatest(duration_ns, 0), max_op_ns), 0, 0
        FROM memset
        WHERE start >= {since:DateTime64(9, 'UTC')} AND start < {until:DateTime64(9, 'UTC')}
              AND ({job:String} = '' OR job = {job:String})
    )
),
named AS (  -- records per rank, compare interval and kernel name: work split at interval edges; times and
            -- counts go with the interval work starts in; busy as the state of a union of the pieces
    SELECT job, label, iv, kind, name,
           sumIf(ns, first_piece) AS ns, sumIf(n, first_piece) AS n, sumIf(nbytes, first_piece) AS nbytes,
           countIf(first_piece) AS starts,
           intervalLengthSumState(greatest(a, iv * iv_ns), least(b, (iv + 1) * iv_ns)) AS busy,
           min(greatest(a, iv * iv_ns)) AS lo, max(least(b, (iv + 1) * iv_ns)) AS hi
    FROM records
    ARRAY JOIN range(intDiv(a, iv_ns), intDiv(greatest(b - 1, a), iv_ns) + 1) AS iv
    GROUP BY job, label, iv, kind, name, iv = intDiv(a, iv_ns) AS first_piece
),
statistics AS (  -- statistics rows in the span: 'k' and 'c' (activity_stats), 'g' (a gpu_stats row)
    SELECT job, if(rank IS NULL, concat('pid ', toString(pid), '@', host), concat('rank ', toString(rank))) AS label,
           kind, name, device_id, a, b, ns, n, measured, nbytes, scaled, busy, fraction
    FROM (
        SELECT job, host, pid, rank, if(category = 'kernel', 'k', 'c') AS kind, toString(name) AS name, device_id,
               toUnixTimestamp64Nano(interval_start) AS a, toUnixTimestamp64Nano(interval_end) AS b,
               estimated_total_ns AS ns, estimated_count AS n, total_ns AS measured, estimated_bytes AS nbytes,
               estimated AS scaled, toInt64(0) AS busy, toFloat64(0) AS fraction
        FROM activity_stats
        WHERE interval_start >= {since:DateTime64(9, 'UTC')} AND interval_start < {until:DateTime64(9, 'UTC')}
              AND ({job:String} = '' OR job = {job:String}) AND category IN ('kernel', 'memcpy')  -- memsets count in busy only
        UNION ALL
        SELECT job, host, pid, rank, 'g', '', device_id, toUnixTimestamp64Nano(interval_start),
               toUnixTimestamp64Nano(interval_end), 0, 0, 0, 0, estimated, busy_ns, busy_fraction
        FROM gpu_stats
        WHERE interval_start >= {since:DateTime64(9, 'UTC')} AND interval_start < {until:DateTime64(9, 'UTC')}
              AND ({job:String} = '' OR job = {job:String})
    )
),
per_interval AS (  -- one rank's tally of one interval, on one basis: its records where it has any
    SELECT * FROM (
        SELECT *,
               max(startsWith(label, 'rank ')) OVER (PARTITION BY job) AS any_rank,
               max(records) OVER (PARTITION BY job, label) AS on_records
        FROM (
            SELECT job, label, iv, true AS records,
                   sumIf(ns, kind = 'k' AND positionCaseInsensitive(name, 'nccl') = 0) AS i_compute,
                   sumIf(ns, kind = 'k' AND positionCaseInsensitive(name, 'nccl') > 0) AS i_nccl,
                   sumIf(n, kind = 'k') AS i_kernels,
                   sumIf(ns, kind = 'c') AS i_copy_ns,
                   sumIf(nbytes, kind = 'c') AS i_copy_bytes,
                   toInt64(intervalLengthSumMerge(busy)) AS i_busy,  -- the union of kernels, copies and memsets
                   false AS i_estimated,
                   min(lo) AS i_lo, max(hi) AS i_hi,
                   toUInt64(0) AS i_seen, toInt64(0) AS i_length,
                   sumMapIf(map(name, ns), kind = 'k' AND starts > 0) AS i_kernel_ns,
                   sumMapIf(map(name, n), kind = 'k' AND starts > 0) AS i_kernel_n
            FROM named
            GROUP BY job, label, iv
            UNION ALL
            SELECT job, label, intDiv(a, iv_ns) AS iv, false,
                   sumIf(ns, kind = 'k' AND positionCaseInsensitive(name, 'nccl') = 0),
                   sumIf(ns, kind = 'k' AND positionCaseInsensitive(name, 'nccl') > 0),
                   sumIf(n, kind = 'k'),
                   sumIf(ns, kind = 'c'),
                   sumIf(nbytes, kind = 'c'),
                   sumIf(busy_ns, kind = 'g'),
                   max(scaled AND kind IN ('k', 'g')),
                   min(a), max(b),
                   uniqExact(a), max(b - a),  -- intervals with rows, their length
                   sumMapIf(map(name, ns), kind = 'k'),
                   sumMapIf(map(name, n), kind = 'k')
            FROM (
                SELECT *,
                       if(kind = 'g' AND scaled,  -- busy of a partly traced interval: scaled as its kernel rows
                          toInt64(if(k_measured > 0, round(toFloat64(toInt128(busy) * k_ns) / k_measured),
                                     round(fraction * (b - a)))),
                          busy) AS busy_ns
                FROM (
                    SELECT *,
                           sumIf(measured, kind = 'k') OVER (PARTITION BY job, label, a, device_id) AS k_measured,
                           sumIf(ns, kind = 'k') OVER (PARTITION BY job, label, a, device_id) AS k_ns
                    FROM statistics
                )
            )
            GROUP BY job, label, iv
        )
    )
    WHERE (startsWith(label, 'rank ') OR NOT any_rank) AND records = on_records
),
per_span AS (  -- each interval's tally, and the whole span's (slot -1): the intervals summed
    SELECT job, label, slot, any(records) AS on_records,
           sum(i_compute) AS s_compute, sum(i_nccl) AS s_nccl, sum(i_kernels) AS s_kernels,
           sum(i_copy_ns) AS s_copy_ns, sum(i_copy_bytes) AS s_copy_bytes, sum(i_busy) AS s_busy,
           max(i_estimated) AS s_estimated, min(i_lo) AS s_lo, max(i_hi) AS s_hi,
           sum(i_seen) AS s_seen, max(i_length) AS s_length,
           sumMap(i_kernel_ns) AS s_kernel_ns, sumMap(i_kernel_n) AS s_kernel_n
    FROM per_interval
    ARRAY JOIN [iv, -1] AS slot
    GROUP BY job, label, slot
),
scaled_span AS (  -- a statistics rank's whole span scaled over the intervals it has no statistics for
    SELECT job, label, slot, on_records, s_lo AS lo, s_hi AS hi,
           if(NOT on_records AND slot = -1 AND round((s_hi - s_lo) / s_length) > s_seen,
              round((s_hi - s_lo) / s_length) / s_seen, 1.0) AS factor,
           if(factor > 1, toInt64(round(s_compute * factor)), toInt64(s_compute)) AS compute_ns,
           if(factor > 1, toInt64(round(s_nccl * factor)), toInt64(s_nccl)) AS nccl_ns,
           if(factor > 1, toInt64(round(s_kernels * factor)), toInt64(s_kernels)) AS kernels,
           if(factor > 1, toInt64(round(s_copy_ns * factor)), toInt64(s_copy_ns)) AS copy_ns,
           if(factor > 1, toInt64(round(s_copy_bytes * factor)), toInt64(s_copy_bytes)) AS copy_bytes,
           if(factor > 1, toInt64(round(s_busy * factor)), toInt64(s_busy)) AS busy_ns,
           s_estimated OR factor > 1 AS estimated,
           mapApply((k, v) -> (k, toInt64(round(v * factor))), s_kernel_ns) AS kernel_ns,
           mapApply((k, v) -> (k, toInt64(round(v * factor))), s_kernel_n) AS kernel_n
    FROM per_span
),
filled AS (  -- a rank on records is compared, idle where it did nothing, in every interval from its first
    SELECT job, label, slot,
           if(has(slots, slot), tallies[indexOf(slots, slot)],
              (0, 0, 0, 0, 0, 0, false, 0, 0, CAST(map(), 'Map(String, Int64)'), CAST(map(), 'Map(String, Int64)'))) AS t
    FROM (
        SELECT job, label, any(on_records) AS records, any(job_slots) AS all_slots, groupArray(slot) AS slots,
               groupArray((compute_ns, nccl_ns, kernels, copy_ns, copy_bytes, busy_ns, estimated, lo, hi,
                           kernel_ns, kernel_n)) AS tallies
        FROM (SELECT *, groupUniqArray(slot) OVER (PARTITION BY job) AS job_slots FROM scaled_span)
        GROUP BY job, label
    )
    ARRAY JOIN arrayFilter(s -> has(slots, s) OR (records AND s > arrayMin(arrayFilter(x -> x >= 0, slots))),
                           all_slots) AS slot
),
compared AS (  -- with the span of every rank's work in the interval and every rank's numbers beside it
    SELECT job, label, slot, t.1 AS compute_ns, t.2 AS nccl_ns, t.3 AS kernels, t.4 AS copy_ns, t.5 AS copy_bytes,
           t.6 AS busy_ns, t.7 AS estimated, t.10 AS kernel_ns, t.11 AS kernel_n,
           minIf(t.8, t.9 > 0) OVER (PARTITION BY job, slot) AS span_lo,
           maxIf(t.9, t.9 > 0) OVER (PARTITION BY job, slot) AS span_hi,
           groupArray((label, compute_ns, nccl_ns, kernels, estimated)) OVER (PARTITION BY job, slot) AS peers,
           groupArray((label, kernel_ns, kernel_n)) OVER (PARTITION BY job, slot) AS rank_kernels
    FROM filled
),
valued AS (  -- one row per metric
    SELECT job, label, slot, estimated, kernel_ns, kernel_n, peers, rank_kernels, length(peers) AS ranks,
           x.1 AS metric, x.2 AS value,
           quantileExactInclusive(0.5)(x.2) OVER (PARTITION BY job, slot, x.1) AS med
    FROM compared
    ARRAY JOIN [
        ('busy_fraction', if(span_hi - span_lo > 0, round(busy_ns / (span_hi - span_lo), 6), 0.0)),
        ('compute_ns', toFloat64(compute_ns)), ('nccl_ns', toFloat64(nccl_ns)), ('copy_ns', toFloat64(copy_ns)),
        ('copy_bytes', toFloat64(copy_bytes)), ('kernels', toFloat64(kernels))
    ] AS x
),
judged AS (  -- the rule: median and MAD of three ranks or more; a pair's straggler against its peer
    SELECT *,
           arraySort(p -> -p.2, peers) AS by_compute,
           by_compute[1] AS slow, by_compute[2] AS peer,
           multiIf(metric = 'compute_ns', peer.2, metric = 'nccl_ns', peer.3, peer.4) AS theirs,
           if(ranks = 2, theirs, med) AS centre,
           value - centre AS dev,
           multiIf(
               ranks >= min_ranks,
               dev != 0
                   AND abs(dev) >= if(metric IN ('kernels', 'copy_bytes') AND estimated, estimate_tolerance, min_relative) * abs(med)
                   AND (mad = 0 OR abs(dev / (mad_scale * mad)) > threshold),
               ranks = 2,
               label = slow.1 AND slow.2 > 0 AND slow.2 >= (1 + min_relative) * peer.2 AND slow.3 <= peer.3
                   AND metric IN ('compute_ns', 'nccl_ns', 'kernels') AND dev != 0
                   AND abs(dev) >= if(metric = 'kernels' AND (slow.5 OR peer.5), estimate_tolerance, min_relative) * abs(theirs),
               false) AS flagged
    FROM (
        SELECT *, quantileExactInclusive(0.5)(abs(value - med)) OVER (PARTITION BY job, slot, metric) AS mad
        FROM valued
    )
),
counted AS (  -- intervals each rank was flagged in, and compared in
    SELECT *,
           uniqExactIf(slot, slot >= 0) OVER (PARTITION BY job, label) AS compared_intervals,
           uniqExactIf(slot, slot >= 0 AND flagged) OVER (PARTITION BY job, label) AS flagged_intervals,
           -- per kernel name: the rank's time and count, and the median rank's (or its peer's)
           arrayDistinct(arrayFlatten(arrayMap(r -> mapKeys(r.2), rank_kernels))) AS names,
           arrayFirst(r -> r.1 != label, rank_kernels) AS other,
           arrayMap(name -> (name, kernel_ns[name],
                             if(ranks = 2, toFloat64(other.2[name]),
                                arrayReduce('quantileExactInclusive(0.5)', arrayMap(r -> r.2[name], rank_kernels))),
                             kernel_n[name],
                             if(ranks = 2, toFloat64(other.3[name]),
                                arrayReduce('quantileExactInclusive(0.5)', arrayMap(r -> r.3[name], rank_kernels)))),
                    names) AS against
    FROM judged
)
SELECT
    job,
    label AS rank,
    metric,
    if(dev > 0, 'high', 'low') AS direction,
    value,
    centre AS median,
    if(ranks = 2, 0.0, mad) AS mad,
    if(ranks >= min_ranks AND mad > 0, round(dev / (mad_scale * mad), 2), NULL) AS z,
    if(centre != 0, round(dev / centre, 4), NULL) AS relative,
    if(ranks = 2, 'peer', 'median') AS reference,
    if(estimated, 'statistics (estimated)', 'measured') AS basis,
    flagged_intervals,
    compared_intervals,
    arraySlice(arraySort(k -> (-k.4, k.1), arrayFilter(k -> k.4 > 0,
        arrayMap(k -> (k.1, k.2, k.3, k.2 - k.3, k.4, k.5), against))), 1, {top:UInt32}) AS kernels_longer,
    arraySlice(arraySort(k -> (k.4, k.1), arrayFilter(k -> k.4 < 0,
        arrayMap(k -> (k.1, k.2, k.3, k.2 - k.3, k.4, k.5), against))), 1, {top:UInt32}) AS kernels_shorter
FROM counted
WHERE slot = -1 AND flagged AND (NOT estimated OR 2 * flagged_intervals >= compared_intervals)
ORDER BY job, startsWith(rank, 'pid'), toUInt64OrZero(substring(rank, 6)), rank,
         indexOf(['busy_fraction', 'compute_ns', 'nccl_ns', 'copy_ns', 'copy_bytes', 'kernels'], metric)
