-- GPU time by the code that launched it (stack_stats joined to stack_table), as the "GPU time by
-- code" of `cuptistream summary` and `cuptistream flame` on a recording of the statistics.
-- Parameters: job String ('' for every job), since and until DateTime64(9, 'UTC') (by interval
-- start), top UInt32. One row per line of the program: a stack's innermost frame that is not
-- cuptistream's own (file '<cuptistream>'), or the reason there is none. Stack and frame ids are
-- each process's own, so the join is per (job, host, process). estimated_*: scaled to whole
-- intervals where only part was traced (always-on mode).
WITH
frames AS (
    SELECT job, host, process_id, frame_id, file, function, line
    FROM stack_table
    ARRAY JOIN frame_ids AS frame_id, files AS file, functions AS function, lines AS line
),
stack_frames AS (
    SELECT DISTINCT job, host, process_id, stack_id, frame_id, depth
    FROM stack_table
    ARRAY JOIN stack_ids AS stack_id, stacks AS frame_list
    ARRAY JOIN frame_list AS frame_id, arrayEnumerate(frame_list) AS depth
),
code AS (  -- per stack: its innermost frame of the program
    SELECT s.job AS job, s.host AS host, s.process_id AS process_id, s.stack_id AS stack_id,
           argMax(if(f.file = '<cuptistream>', f.function, concat(f.function, ' (', f.file, ':', toString(f.line), ')')),
                  (f.file != '<cuptistream>', s.depth)) AS code
    FROM stack_frames AS s
    INNER JOIN frames AS f ON f.job = s.job AND f.host = s.host AND f.process_id = s.process_id
                          AND f.frame_id = s.frame_id
    GROUP BY s.job, s.host, s.process_id, s.stack_id
),
gpu AS (
    SELECT job, host, process_id, stack_id, sum(ns) AS stack_ns, sum(n) AS stack_launches,
           sum(estimated_ns) AS stack_estimated_ns, sum(estimated_n) AS stack_estimated_launches,
           max(estimated) AS stack_estimated
    FROM stack_stats
    ARRAY JOIN
        stack_ids AS stack_id, gpu_ns AS ns, launches AS n,
        if(length(estimated_gpu_ns) = length(stack_ids), estimated_gpu_ns, gpu_ns) AS estimated_ns,
        if(length(estimated_launches) = length(stack_ids), estimated_launches, launches) AS estimated_n
    WHERE interval_start >= {since:DateTime64(9, 'UTC')} AND interval_start < {until:DateTime64(9, 'UTC')}
      AND ({job:String} = '' OR job = {job:String})
    GROUP BY job, host, process_id, stack_id
)
SELECT
    multiIf(g.stack_id = -1, '[no stack recorded]', g.stack_id = -2, '[no Python stack]',
            g.stack_id = -3, '[other stacks]', c.code = '', '[stack not in any stack_table]', c.code) AS code,
    sum(g.stack_ns) AS total_ns,
    sum(g.stack_launches) AS launches,
    sum(g.stack_estimated_ns) AS estimated_total_ns,
    sum(g.stack_estimated_launches) AS estimated_launches,
    estimated_total_ns / sum(estimated_total_ns) OVER () AS share,
    max(g.stack_estimated) AS estimated,
    uniqExact(g.job, g.host, g.process_id) AS processes
FROM gpu AS g
LEFT JOIN code AS c ON c.job = g.job AND c.host = g.host AND c.process_id = g.process_id AND c.stack_id = g.stack_id
GROUP BY code
ORDER BY estimated_total_ns DESC, code
LIMIT {top:UInt32}
