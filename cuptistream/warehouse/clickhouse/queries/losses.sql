-- Losses by stage: what was lost where, and why, over a span (`cuptistream summary`'s losses table,
-- across hosts). Parameters: job String ('' for every job), since and until DateTime64(9, 'UTC')
-- (a loss counts when its span starts in [since, until)). count is in `unit` (events, records,
-- samples); reports is the number of loss events.
SELECT
    stage,
    reason,
    unit,
    count() AS reports,
    sum(`count`) AS count,
    uniqExact(host) AS hosts,
    uniqExact(job) AS jobs,
    min(since) AS first,
    max(until) AS last
FROM loss
WHERE since >= {since:DateTime64(9, 'UTC')} AND since < {until:DateTime64(9, 'UTC')}
  AND ({job:String} = '' OR job = {job:String})
GROUP BY stage, reason, unit
ORDER BY count DESC, stage, reason, unit
