-- cuptistream: ClickHouse schema for Kafka value_format: jsonl rows (docs/warehouse.md).
-- Generated from the event Structs by scripts/clickhouse_schema.py; do not edit.
-- TTL: 14 days for per-record families, 400 days for statistics, accounting and lifecycle (0: kept for ever).


CREATE TABLE IF NOT EXISTS `cuptistream_rows`
(
    `type` String,
    `start` Int64,
    `end` Int64,
    `name` String,
    `device_id` Int64,
    `context_id` Int64,
    `stream_id` Int64,
    `correlation_id` Int64,
    `grid` String,
    `block` String,
    `registers_per_thread` Int64,
    `static_shared_bytes` Int64,
    `dynamic_shared_bytes` Int64,
    `local_memory_per_thread` Int64,
    `graph_id` Int64,
    `graph_node_id` Int64,
    `demangled_name` Nullable(String),
    `bytes` Int64,
    `copy_kind` String,
    `src_kind` String,
    `dst_kind` String,
    `src_device_id` Nullable(Int64),
    `dst_device_id` Nullable(Int64),
    `value` Int64,
    `memory_kind` String,
    `operation` String,
    `timestamp` Int64,
    `node_id` Int64,
    `node_type` String,
    `original_node_id` Int64,
    `domain` String,
    `cbid` Int64,
    `process_id` Int64,
    `thread_id` Int64,
    `return_value` Int64,
    `range_id` Int64,
    `depth` Int64,
    `category` String,
    `color` Nullable(Int64),
    `payload` Nullable(Float64),
    `external_kind` String,
    `external_id` UInt64,
    `sync_type` String,
    `cuda_event_id` Int64,
    `event_id` Int64,
    `device_timestamp` Int64,
    `address` UInt64,
    `source` String,
    `pool_type` String,
    `size` Int64,
    `release_threshold` Int64,
    `utilized_size` Int64,
    `counter` String,
    `src_id` Int64,
    `dst_id` Int64,
    `power_mw` Nullable(Int64),
    `power_limit_mw` Nullable(Int64),
    `temperature_c` Nullable(Int64),
    `sm_clock_mhz` Nullable(Int64),
    `memory_clock_mhz` Nullable(Int64),
    `fan_speed_percent` Nullable(Int64),
    `throttle_reasons` Nullable(Int64),
    `module_id` Int64,
    `cubin_crc` UInt64,
    `cubin_size` Int64,
    `uuid` String,
    `compute_capability` String,
    `sm_count` Int64,
    `global_memory_bytes` Int64,
    `core_clock_khz` Int64,
    `cache_path` String,
    `cache_size` Int64,
    `overhead_kind` String,
    `object_kind` String,
    `object_id` Int64,
    `severity` String,
    `origin` String,
    `message` String,
    `result_code` Int64,
    `kind` String,
    `fields` String,
    `samples` String,
    `total_samples` Int64,
    `non_user_samples` Int64,
    `dropped_samples` Int64,
    `hardware_buffer_full` Bool,
    `sampling_period` Int64,
    `records` String,
    `chip` String,
    `metrics` String,
    `starts` String,
    `ends` String,
    `values` String,
    `passes` Int64,
    `names` String,
    `launches` String,
    `not_profiled` Int64,
    `budget` Float64,
    `share` Float64,
    `window_s` Float64,
    `pause_s` Float64,
    `duty` Float64,
    `unit_cost` Float64,
    `expected_cost` Float64,
    `measured_open_s` Float64,
    `measured_host_s` Float64,
    `estimated_gpu_s` Float64,
    `windows` Int64,
    `reason` String,
    `per_window` Bool,
    `tool` String,
    `missed` String,
    `standby` String,
    `holder` String,
    `window` Int64,
    `kinds` String,
    `on_demand` Bool,
    `request` Int64,
    `fresh` Bool,
    `frame_ids` String,
    `files` String,
    `functions` String,
    `lines` String,
    `stack_ids` String,
    `stacks` String,
    `interval_ns` Int64,
    `thread_ids` String,
    `times` String,
    `previous` String,
    `interval_start` Int64,
    `interval_end` Int64,
    `count` Int64,
    `total_ns` Int64,
    `durations` String,
    `traced_ns` Int64,
    `estimated` Bool,
    `estimated_count` Int64,
    `estimated_total_ns` Int64,
    `estimated_bytes` Int64,
    `nccl` Bool,
    `gpu_ns` String,
    `estimated_gpu_ns` String,
    `estimated_launches` String,
    `traced_fraction` Float64,
    `busy_ns` Int64,
    `busy_fraction` Float64,
    `kernel_ns` Int64,
    `nccl_ns` Int64,
    `copy_ns` Int64,
    `memset_ns` Int64,
    `kernels` Int64,
    `copies` Int64,
    `memsets` Int64,
    `copy_bytes` Int64,
    `mean` String,
    `p5` String,
    `p50` String,
    `p95` String,
    `covered_ns` Int64,
    `covered_share` Float64,
    `own_share` Float64,
    `all_share` Float64,
    `stage` String,
    `since` Int64,
    `until` Int64,
    `unit` Nullable(String),
    `stages` String,
    `session_id` String,
    `seq` UInt64,
    `schema_version` UInt16,
    `host` String,
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` String,
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `device_uuid` Nullable(String),
    `attributes` Map(String, String)
)
ENGINE = Kafka
SETTINGS
    kafka_broker_list = 'kafka:9092',
    kafka_topic_list = 'cuptistream.rows',
    kafka_group_name = 'clickhouse-cuptistream',
    kafka_format = 'JSONEachRow',
    kafka_num_consumers = 1,
    input_format_skip_unknown_fields = 1,
    input_format_json_read_objects_as_strings = 1,
    input_format_json_read_arrays_as_strings = 1,
    input_format_json_read_numbers_as_strings = 1,
    input_format_json_read_bools_as_strings = 1;

-- kernel: cuptistream.events.Kernel
CREATE TABLE IF NOT EXISTS `kernel`
(
    `start` DateTime64(9, 'UTC'),
    `end` DateTime64(9, 'UTC'),
    `name` LowCardinality(String),
    `device_id` Int64,
    `context_id` Int64,
    `stream_id` Int64,
    `correlation_id` Int64,
    `grid` Tuple(Int64, Int64, Int64),
    `block` Tuple(Int64, Int64, Int64),
    `registers_per_thread` Int64,
    `static_shared_bytes` Int64,
    `dynamic_shared_bytes` Int64,
    `local_memory_per_thread` Int64,
    `graph_id` Int64,
    `graph_node_id` Int64,
    `demangled_name` LowCardinality(Nullable(String)),
    `duration_ns` Int64,
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `device_uuid` LowCardinality(Nullable(String)),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`start`)
ORDER BY (`job`, `host`, `pid`, `start`)
TTL toDateTime(`start`) + INTERVAL 14 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `kernel_mv` TO `kernel` AS
SELECT
    fromUnixTimestamp64Nano(`cuptistream_rows`.`start`, 'UTC') AS `start`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`end`, 'UTC') AS `end`,
    `cuptistream_rows`.`name` AS `name`,
    `cuptistream_rows`.`device_id` AS `device_id`,
    `cuptistream_rows`.`context_id` AS `context_id`,
    `cuptistream_rows`.`stream_id` AS `stream_id`,
    `cuptistream_rows`.`correlation_id` AS `correlation_id`,
    JSONExtract(`cuptistream_rows`.`grid`, 'Tuple(Int64, Int64, Int64)') AS `grid`,
    JSONExtract(`cuptistream_rows`.`block`, 'Tuple(Int64, Int64, Int64)') AS `block`,
    `cuptistream_rows`.`registers_per_thread` AS `registers_per_thread`,
    `cuptistream_rows`.`static_shared_bytes` AS `static_shared_bytes`,
    `cuptistream_rows`.`dynamic_shared_bytes` AS `dynamic_shared_bytes`,
    `cuptistream_rows`.`local_memory_per_thread` AS `local_memory_per_thread`,
    `cuptistream_rows`.`graph_id` AS `graph_id`,
    `cuptistream_rows`.`graph_node_id` AS `graph_node_id`,
    `cuptistream_rows`.`demangled_name` AS `demangled_name`,
    `cuptistream_rows`.`end` - `cuptistream_rows`.`start` AS `duration_ns`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`device_uuid` AS `device_uuid`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'kernel';

-- memcpy: cuptistream.events.Memcpy
CREATE TABLE IF NOT EXISTS `memcpy`
(
    `start` DateTime64(9, 'UTC'),
    `end` DateTime64(9, 'UTC'),
    `bytes` Int64,
    `copy_kind` LowCardinality(String),
    `src_kind` LowCardinality(String),
    `dst_kind` LowCardinality(String),
    `device_id` Int64,
    `context_id` Int64,
    `stream_id` Int64,
    `correlation_id` Int64,
    `src_device_id` Nullable(Int64),
    `dst_device_id` Nullable(Int64),
    `graph_id` Int64,
    `graph_node_id` Int64,
    `duration_ns` Int64,
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `device_uuid` LowCardinality(Nullable(String)),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`start`)
ORDER BY (`job`, `host`, `pid`, `start`)
TTL toDateTime(`start`) + INTERVAL 14 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `memcpy_mv` TO `memcpy` AS
SELECT
    fromUnixTimestamp64Nano(`cuptistream_rows`.`start`, 'UTC') AS `start`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`end`, 'UTC') AS `end`,
    `cuptistream_rows`.`bytes` AS `bytes`,
    `cuptistream_rows`.`copy_kind` AS `copy_kind`,
    `cuptistream_rows`.`src_kind` AS `src_kind`,
    `cuptistream_rows`.`dst_kind` AS `dst_kind`,
    `cuptistream_rows`.`device_id` AS `device_id`,
    `cuptistream_rows`.`context_id` AS `context_id`,
    `cuptistream_rows`.`stream_id` AS `stream_id`,
    `cuptistream_rows`.`correlation_id` AS `correlation_id`,
    `cuptistream_rows`.`src_device_id` AS `src_device_id`,
    `cuptistream_rows`.`dst_device_id` AS `dst_device_id`,
    `cuptistream_rows`.`graph_id` AS `graph_id`,
    `cuptistream_rows`.`graph_node_id` AS `graph_node_id`,
    `cuptistream_rows`.`end` - `cuptistream_rows`.`start` AS `duration_ns`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`device_uuid` AS `device_uuid`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'memcpy';

-- memset: cuptistream.events.Memset
CREATE TABLE IF NOT EXISTS `memset`
(
    `start` DateTime64(9, 'UTC'),
    `end` DateTime64(9, 'UTC'),
    `bytes` Int64,
    `value` Int64,
    `memory_kind` LowCardinality(String),
    `device_id` Int64,
    `context_id` Int64,
    `stream_id` Int64,
    `correlation_id` Int64,
    `graph_id` Int64,
    `graph_node_id` Int64,
    `duration_ns` Int64,
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `device_uuid` LowCardinality(Nullable(String)),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`start`)
ORDER BY (`job`, `host`, `pid`, `start`)
TTL toDateTime(`start`) + INTERVAL 14 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `memset_mv` TO `memset` AS
SELECT
    fromUnixTimestamp64Nano(`cuptistream_rows`.`start`, 'UTC') AS `start`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`end`, 'UTC') AS `end`,
    `cuptistream_rows`.`bytes` AS `bytes`,
    `cuptistream_rows`.`value` AS `value`,
    `cuptistream_rows`.`memory_kind` AS `memory_kind`,
    `cuptistream_rows`.`device_id` AS `device_id`,
    `cuptistream_rows`.`context_id` AS `context_id`,
    `cuptistream_rows`.`stream_id` AS `stream_id`,
    `cuptistream_rows`.`correlation_id` AS `correlation_id`,
    `cuptistream_rows`.`graph_id` AS `graph_id`,
    `cuptistream_rows`.`graph_node_id` AS `graph_node_id`,
    `cuptistream_rows`.`end` - `cuptistream_rows`.`start` AS `duration_ns`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`device_uuid` AS `device_uuid`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'memset';

-- graph_launch: cuptistream.events.GraphLaunch
CREATE TABLE IF NOT EXISTS `graph_launch`
(
    `start` DateTime64(9, 'UTC'),
    `end` DateTime64(9, 'UTC'),
    `graph_id` Int64,
    `device_id` Int64,
    `context_id` Int64,
    `stream_id` Int64,
    `correlation_id` Int64,
    `duration_ns` Int64,
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `device_uuid` LowCardinality(Nullable(String)),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`start`)
ORDER BY (`job`, `host`, `pid`, `start`)
TTL toDateTime(`start`) + INTERVAL 14 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `graph_launch_mv` TO `graph_launch` AS
SELECT
    fromUnixTimestamp64Nano(`cuptistream_rows`.`start`, 'UTC') AS `start`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`end`, 'UTC') AS `end`,
    `cuptistream_rows`.`graph_id` AS `graph_id`,
    `cuptistream_rows`.`device_id` AS `device_id`,
    `cuptistream_rows`.`context_id` AS `context_id`,
    `cuptistream_rows`.`stream_id` AS `stream_id`,
    `cuptistream_rows`.`correlation_id` AS `correlation_id`,
    `cuptistream_rows`.`end` - `cuptistream_rows`.`start` AS `duration_ns`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`device_uuid` AS `device_uuid`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'graph_launch';

-- graph_node: cuptistream.events.GraphNode
CREATE TABLE IF NOT EXISTS `graph_node`
(
    `operation` LowCardinality(String),
    `timestamp` DateTime64(9, 'UTC'),
    `graph_id` Int64,
    `node_id` Int64,
    `node_type` LowCardinality(String),
    `original_node_id` Int64,
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`timestamp`)
ORDER BY (`job`, `host`, `pid`, `timestamp`)
TTL toDateTime(`timestamp`) + INTERVAL 14 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `graph_node_mv` TO `graph_node` AS
SELECT
    `cuptistream_rows`.`operation` AS `operation`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`timestamp`, 'UTC') AS `timestamp`,
    `cuptistream_rows`.`graph_id` AS `graph_id`,
    `cuptistream_rows`.`node_id` AS `node_id`,
    `cuptistream_rows`.`node_type` AS `node_type`,
    `cuptistream_rows`.`original_node_id` AS `original_node_id`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'graph_node';

-- api: cuptistream.events.ApiCall
CREATE TABLE IF NOT EXISTS `api`
(
    `domain` LowCardinality(String),
    `name` LowCardinality(String),
    `cbid` Int64,
    `start` DateTime64(9, 'UTC'),
    `end` DateTime64(9, 'UTC'),
    `process_id` Int64,
    `thread_id` Int64,
    `correlation_id` Int64,
    `return_value` Int64,
    `duration_ns` Int64,
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`start`)
ORDER BY (`job`, `host`, `pid`, `start`)
TTL toDateTime(`start`) + INTERVAL 14 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `api_mv` TO `api` AS
SELECT
    `cuptistream_rows`.`domain` AS `domain`,
    `cuptistream_rows`.`name` AS `name`,
    `cuptistream_rows`.`cbid` AS `cbid`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`start`, 'UTC') AS `start`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`end`, 'UTC') AS `end`,
    `cuptistream_rows`.`process_id` AS `process_id`,
    `cuptistream_rows`.`thread_id` AS `thread_id`,
    `cuptistream_rows`.`correlation_id` AS `correlation_id`,
    `cuptistream_rows`.`return_value` AS `return_value`,
    `cuptistream_rows`.`end` - `cuptistream_rows`.`start` AS `duration_ns`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'api';

-- nvtx_range: cuptistream.events.NvtxRange
CREATE TABLE IF NOT EXISTS `nvtx_range`
(
    `name` LowCardinality(String),
    `start` DateTime64(9, 'UTC'),
    `end` DateTime64(9, 'UTC'),
    `thread_id` Int64,
    `range_id` Int64,
    `depth` Int64,
    `domain` LowCardinality(String),
    `category` Int64,
    `color` Nullable(Int64),
    `payload` Nullable(Float64),
    `duration_ns` Int64,
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`start`)
ORDER BY (`job`, `host`, `pid`, `start`)
TTL toDateTime(`start`) + INTERVAL 14 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `nvtx_range_mv` TO `nvtx_range` AS
SELECT
    `cuptistream_rows`.`name` AS `name`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`start`, 'UTC') AS `start`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`end`, 'UTC') AS `end`,
    `cuptistream_rows`.`thread_id` AS `thread_id`,
    `cuptistream_rows`.`range_id` AS `range_id`,
    `cuptistream_rows`.`depth` AS `depth`,
    `cuptistream_rows`.`domain` AS `domain`,
    JSONExtract(`cuptistream_rows`.`category`, 'Int64') AS `category`,
    `cuptistream_rows`.`color` AS `color`,
    `cuptistream_rows`.`payload` AS `payload`,
    `cuptistream_rows`.`end` - `cuptistream_rows`.`start` AS `duration_ns`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'nvtx_range';

-- nvtx_marker: cuptistream.events.NvtxMarker
CREATE TABLE IF NOT EXISTS `nvtx_marker`
(
    `name` LowCardinality(String),
    `timestamp` DateTime64(9, 'UTC'),
    `thread_id` Int64,
    `domain` LowCardinality(String),
    `category` Int64,
    `color` Nullable(Int64),
    `payload` Nullable(Float64),
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`timestamp`)
ORDER BY (`job`, `host`, `pid`, `timestamp`)
TTL toDateTime(`timestamp`) + INTERVAL 14 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `nvtx_marker_mv` TO `nvtx_marker` AS
SELECT
    `cuptistream_rows`.`name` AS `name`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`timestamp`, 'UTC') AS `timestamp`,
    `cuptistream_rows`.`thread_id` AS `thread_id`,
    `cuptistream_rows`.`domain` AS `domain`,
    JSONExtract(`cuptistream_rows`.`category`, 'Int64') AS `category`,
    `cuptistream_rows`.`color` AS `color`,
    `cuptistream_rows`.`payload` AS `payload`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'nvtx_marker';

-- external_correlation: cuptistream.events.ExternalCorrelation
CREATE TABLE IF NOT EXISTS `external_correlation`
(
    `external_kind` LowCardinality(String),
    `external_id` UInt64,
    `correlation_id` Int64,
    `received` DateTime64(9, 'UTC') DEFAULT now64(9, 'UTC'),
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`received`)
ORDER BY (`job`, `host`, `pid`, `received`)
TTL toDateTime(`received`) + INTERVAL 14 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `external_correlation_mv` TO `external_correlation` AS
SELECT
    `cuptistream_rows`.`external_kind` AS `external_kind`,
    `cuptistream_rows`.`external_id` AS `external_id`,
    `cuptistream_rows`.`correlation_id` AS `correlation_id`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'external_correlation';

-- synchronization: cuptistream.events.Synchronization
CREATE TABLE IF NOT EXISTS `synchronization`
(
    `sync_type` LowCardinality(String),
    `start` DateTime64(9, 'UTC'),
    `end` DateTime64(9, 'UTC'),
    `context_id` Int64,
    `stream_id` Int64,
    `correlation_id` Int64,
    `cuda_event_id` Int64,
    `duration_ns` Int64,
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`start`)
ORDER BY (`job`, `host`, `pid`, `start`)
TTL toDateTime(`start`) + INTERVAL 14 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `synchronization_mv` TO `synchronization` AS
SELECT
    `cuptistream_rows`.`sync_type` AS `sync_type`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`start`, 'UTC') AS `start`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`end`, 'UTC') AS `end`,
    `cuptistream_rows`.`context_id` AS `context_id`,
    `cuptistream_rows`.`stream_id` AS `stream_id`,
    `cuptistream_rows`.`correlation_id` AS `correlation_id`,
    `cuptistream_rows`.`cuda_event_id` AS `cuda_event_id`,
    `cuptistream_rows`.`end` - `cuptistream_rows`.`start` AS `duration_ns`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'synchronization';

-- cuda_event: cuptistream.events.CudaEvent
CREATE TABLE IF NOT EXISTS `cuda_event`
(
    `event_id` Int64,
    `context_id` Int64,
    `stream_id` Int64,
    `correlation_id` Int64,
    `device_timestamp` DateTime64(9, 'UTC'),
    `received` DateTime64(9, 'UTC') DEFAULT now64(9, 'UTC'),
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`received`)
ORDER BY (`job`, `host`, `pid`, `received`)
TTL toDateTime(`received`) + INTERVAL 14 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `cuda_event_mv` TO `cuda_event` AS
SELECT
    `cuptistream_rows`.`event_id` AS `event_id`,
    `cuptistream_rows`.`context_id` AS `context_id`,
    `cuptistream_rows`.`stream_id` AS `stream_id`,
    `cuptistream_rows`.`correlation_id` AS `correlation_id`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`device_timestamp`, 'UTC') AS `device_timestamp`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'cuda_event';

-- memory: cuptistream.events.MemoryAllocation
CREATE TABLE IF NOT EXISTS `memory`
(
    `operation` LowCardinality(String),
    `timestamp` DateTime64(9, 'UTC'),
    `address` UInt64,
    `bytes` Int64,
    `memory_kind` LowCardinality(String),
    `device_id` Int64,
    `context_id` Int64,
    `stream_id` Int64,
    `correlation_id` Int64,
    `source` LowCardinality(String),
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `device_uuid` LowCardinality(Nullable(String)),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`timestamp`)
ORDER BY (`job`, `host`, `pid`, `timestamp`)
TTL toDateTime(`timestamp`) + INTERVAL 14 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `memory_mv` TO `memory` AS
SELECT
    `cuptistream_rows`.`operation` AS `operation`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`timestamp`, 'UTC') AS `timestamp`,
    `cuptistream_rows`.`address` AS `address`,
    `cuptistream_rows`.`bytes` AS `bytes`,
    `cuptistream_rows`.`memory_kind` AS `memory_kind`,
    `cuptistream_rows`.`device_id` AS `device_id`,
    `cuptistream_rows`.`context_id` AS `context_id`,
    `cuptistream_rows`.`stream_id` AS `stream_id`,
    `cuptistream_rows`.`correlation_id` AS `correlation_id`,
    `cuptistream_rows`.`source` AS `source`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`device_uuid` AS `device_uuid`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'memory';

-- memory_pool: cuptistream.events.MemoryPool
CREATE TABLE IF NOT EXISTS `memory_pool`
(
    `operation` LowCardinality(String),
    `timestamp` DateTime64(9, 'UTC'),
    `address` UInt64,
    `pool_type` LowCardinality(String),
    `size` Int64,
    `release_threshold` Int64,
    `device_id` Int64,
    `utilized_size` Int64,
    `correlation_id` Int64,
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `device_uuid` LowCardinality(Nullable(String)),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`timestamp`)
ORDER BY (`job`, `host`, `pid`, `timestamp`)
TTL toDateTime(`timestamp`) + INTERVAL 400 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `memory_pool_mv` TO `memory_pool` AS
SELECT
    `cuptistream_rows`.`operation` AS `operation`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`timestamp`, 'UTC') AS `timestamp`,
    `cuptistream_rows`.`address` AS `address`,
    `cuptistream_rows`.`pool_type` AS `pool_type`,
    `cuptistream_rows`.`size` AS `size`,
    `cuptistream_rows`.`release_threshold` AS `release_threshold`,
    `cuptistream_rows`.`device_id` AS `device_id`,
    `cuptistream_rows`.`utilized_size` AS `utilized_size`,
    `cuptistream_rows`.`correlation_id` AS `correlation_id`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`device_uuid` AS `device_uuid`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'memory_pool';

-- unified_memory: cuptistream.events.UnifiedMemory
CREATE TABLE IF NOT EXISTS `unified_memory`
(
    `counter` LowCardinality(String),
    `start` DateTime64(9, 'UTC'),
    `end` DateTime64(9, 'UTC'),
    `value` Int64,
    `address` UInt64,
    `src_id` Int64,
    `dst_id` Int64,
    `process_id` Int64,
    `duration_ns` Int64,
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`start`)
ORDER BY (`job`, `host`, `pid`, `start`)
TTL toDateTime(`start`) + INTERVAL 14 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `unified_memory_mv` TO `unified_memory` AS
SELECT
    `cuptistream_rows`.`counter` AS `counter`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`start`, 'UTC') AS `start`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`end`, 'UTC') AS `end`,
    `cuptistream_rows`.`value` AS `value`,
    `cuptistream_rows`.`address` AS `address`,
    `cuptistream_rows`.`src_id` AS `src_id`,
    `cuptistream_rows`.`dst_id` AS `dst_id`,
    `cuptistream_rows`.`process_id` AS `process_id`,
    `cuptistream_rows`.`end` - `cuptistream_rows`.`start` AS `duration_ns`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'unified_memory';

-- environment: cuptistream.events.Environment
CREATE TABLE IF NOT EXISTS `environment`
(
    `device_id` Int64,
    `timestamp` DateTime64(9, 'UTC'),
    `power_mw` Nullable(Int64),
    `power_limit_mw` Nullable(Int64),
    `temperature_c` Nullable(Int64),
    `sm_clock_mhz` Nullable(Int64),
    `memory_clock_mhz` Nullable(Int64),
    `fan_speed_percent` Nullable(Int64),
    `throttle_reasons` Nullable(Int64),
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `device_uuid` LowCardinality(Nullable(String)),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`timestamp`)
ORDER BY (`job`, `host`, `pid`, `timestamp`)
TTL toDateTime(`timestamp`) + INTERVAL 400 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `environment_mv` TO `environment` AS
SELECT
    `cuptistream_rows`.`device_id` AS `device_id`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`timestamp`, 'UTC') AS `timestamp`,
    `cuptistream_rows`.`power_mw` AS `power_mw`,
    `cuptistream_rows`.`power_limit_mw` AS `power_limit_mw`,
    `cuptistream_rows`.`temperature_c` AS `temperature_c`,
    `cuptistream_rows`.`sm_clock_mhz` AS `sm_clock_mhz`,
    `cuptistream_rows`.`memory_clock_mhz` AS `memory_clock_mhz`,
    `cuptistream_rows`.`fan_speed_percent` AS `fan_speed_percent`,
    `cuptistream_rows`.`throttle_reasons` AS `throttle_reasons`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`device_uuid` AS `device_uuid`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'environment';

-- resource: cuptistream.events.ResourceChange
CREATE TABLE IF NOT EXISTS `resource`
(
    `operation` LowCardinality(String),
    `timestamp` DateTime64(9, 'UTC'),
    `device_id` Int64,
    `context_id` Int64,
    `stream_id` Int64,
    `module_id` Int64,
    `cubin_crc` UInt64,
    `cubin_size` Int64,
    `name` LowCardinality(String),
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `device_uuid` LowCardinality(Nullable(String)),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`timestamp`)
ORDER BY (`job`, `host`, `pid`, `timestamp`)
TTL toDateTime(`timestamp`) + INTERVAL 400 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `resource_mv` TO `resource` AS
SELECT
    `cuptistream_rows`.`operation` AS `operation`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`timestamp`, 'UTC') AS `timestamp`,
    `cuptistream_rows`.`device_id` AS `device_id`,
    `cuptistream_rows`.`context_id` AS `context_id`,
    `cuptistream_rows`.`stream_id` AS `stream_id`,
    `cuptistream_rows`.`module_id` AS `module_id`,
    `cuptistream_rows`.`cubin_crc` AS `cubin_crc`,
    `cuptistream_rows`.`cubin_size` AS `cubin_size`,
    `cuptistream_rows`.`name` AS `name`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`device_uuid` AS `device_uuid`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'resource';

-- device: cuptistream.events.Device
CREATE TABLE IF NOT EXISTS `device`
(
    `device_id` Int64,
    `name` LowCardinality(String),
    `uuid` LowCardinality(String),
    `compute_capability` Tuple(Int64, Int64),
    `sm_count` Int64,
    `global_memory_bytes` Int64,
    `core_clock_khz` Int64,
    `received` DateTime64(9, 'UTC') DEFAULT now64(9, 'UTC'),
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `device_uuid` LowCardinality(Nullable(String)),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`received`)
ORDER BY (`job`, `host`, `pid`, `received`)
TTL toDateTime(`received`) + INTERVAL 400 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `device_mv` TO `device` AS
SELECT
    `cuptistream_rows`.`device_id` AS `device_id`,
    `cuptistream_rows`.`name` AS `name`,
    `cuptistream_rows`.`uuid` AS `uuid`,
    JSONExtract(`cuptistream_rows`.`compute_capability`, 'Tuple(Int64, Int64)') AS `compute_capability`,
    `cuptistream_rows`.`sm_count` AS `sm_count`,
    `cuptistream_rows`.`global_memory_bytes` AS `global_memory_bytes`,
    `cuptistream_rows`.`core_clock_khz` AS `core_clock_khz`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`device_uuid` AS `device_uuid`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'device';

-- jit: cuptistream.events.Jit
CREATE TABLE IF NOT EXISTS `jit`
(
    `operation` LowCardinality(String),
    `start` DateTime64(9, 'UTC'),
    `end` DateTime64(9, 'UTC'),
    `device_id` Int64,
    `correlation_id` Int64,
    `cache_path` String,
    `cache_size` Int64,
    `duration_ns` Int64,
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `device_uuid` LowCardinality(Nullable(String)),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`start`)
ORDER BY (`job`, `host`, `pid`, `start`)
TTL toDateTime(`start`) + INTERVAL 14 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `jit_mv` TO `jit` AS
SELECT
    `cuptistream_rows`.`operation` AS `operation`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`start`, 'UTC') AS `start`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`end`, 'UTC') AS `end`,
    `cuptistream_rows`.`device_id` AS `device_id`,
    `cuptistream_rows`.`correlation_id` AS `correlation_id`,
    `cuptistream_rows`.`cache_path` AS `cache_path`,
    `cuptistream_rows`.`cache_size` AS `cache_size`,
    `cuptistream_rows`.`end` - `cuptistream_rows`.`start` AS `duration_ns`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`device_uuid` AS `device_uuid`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'jit';

-- overhead: cuptistream.events.Overhead
CREATE TABLE IF NOT EXISTS `overhead`
(
    `overhead_kind` LowCardinality(String),
    `object_kind` LowCardinality(String),
    `object_id` Int64,
    `start` DateTime64(9, 'UTC'),
    `end` DateTime64(9, 'UTC'),
    `duration_ns` Int64,
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`start`)
ORDER BY (`job`, `host`, `pid`, `start`)
TTL toDateTime(`start`) + INTERVAL 14 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `overhead_mv` TO `overhead` AS
SELECT
    `cuptistream_rows`.`overhead_kind` AS `overhead_kind`,
    `cuptistream_rows`.`object_kind` AS `object_kind`,
    `cuptistream_rows`.`object_id` AS `object_id`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`start`, 'UTC') AS `start`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`end`, 'UTC') AS `end`,
    `cuptistream_rows`.`end` - `cuptistream_rows`.`start` AS `duration_ns`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'overhead';

-- error: cuptistream.events.Error
CREATE TABLE IF NOT EXISTS `error`
(
    `severity` LowCardinality(String),
    `origin` LowCardinality(String),
    `message` String,
    `timestamp` DateTime64(9, 'UTC'),
    `result_code` Int64,
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`timestamp`)
ORDER BY (`job`, `host`, `pid`, `timestamp`)
TTL toDateTime(`timestamp`) + INTERVAL 400 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `error_mv` TO `error` AS
SELECT
    `cuptistream_rows`.`severity` AS `severity`,
    `cuptistream_rows`.`origin` AS `origin`,
    `cuptistream_rows`.`message` AS `message`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`timestamp`, 'UTC') AS `timestamp`,
    `cuptistream_rows`.`result_code` AS `result_code`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'error';

-- activity: cuptistream.events.Activity
CREATE TABLE IF NOT EXISTS `activity`
(
    `kind` LowCardinality(String),
    `fields` Map(String, String),
    `received` DateTime64(9, 'UTC') DEFAULT now64(9, 'UTC'),
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`received`)
ORDER BY (`job`, `host`, `pid`, `received`)
TTL toDateTime(`received`) + INTERVAL 14 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `activity_mv` TO `activity` AS
SELECT
    `cuptistream_rows`.`kind` AS `kind`,
    CAST(JSONExtractKeysAndValuesRaw(`cuptistream_rows`.`fields`), 'Map(String, String)') AS `fields`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'activity';

-- pc_samples: cuptistream.events.PcSampleBatch
CREATE TABLE IF NOT EXISTS `pc_samples`
(
    `timestamp` DateTime64(9, 'UTC'),
    `device_id` Int64,
    `context_id` Int64,
    `range_id` Int64,
    `samples` Array(Tuple(cubin_crc Int64, function_name String, function_index Int64, pc_offset Int64, stalls Map(String, Int64))),
    `total_samples` Int64,
    `non_user_samples` Int64,
    `dropped_samples` Int64,
    `hardware_buffer_full` Bool,
    `sampling_period` Int64,
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `device_uuid` LowCardinality(Nullable(String)),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`timestamp`)
ORDER BY (`job`, `host`, `pid`, `timestamp`)
TTL toDateTime(`timestamp`) + INTERVAL 14 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `pc_samples_mv` TO `pc_samples` AS
SELECT
    fromUnixTimestamp64Nano(`cuptistream_rows`.`timestamp`, 'UTC') AS `timestamp`,
    `cuptistream_rows`.`device_id` AS `device_id`,
    `cuptistream_rows`.`context_id` AS `context_id`,
    `cuptistream_rows`.`range_id` AS `range_id`,
    JSONExtract(`cuptistream_rows`.`samples`, 'Array(Tuple(cubin_crc Int64, function_name String, function_index Int64, pc_offset Int64, stalls Map(String, Int64)))') AS `samples`,
    `cuptistream_rows`.`total_samples` AS `total_samples`,
    `cuptistream_rows`.`non_user_samples` AS `non_user_samples`,
    `cuptistream_rows`.`dropped_samples` AS `dropped_samples`,
    `cuptistream_rows`.`hardware_buffer_full` AS `hardware_buffer_full`,
    `cuptistream_rows`.`sampling_period` AS `sampling_period`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`device_uuid` AS `device_uuid`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'pc_samples';

-- sass_metrics: cuptistream.events.SassMetricBatch
CREATE TABLE IF NOT EXISTS `sass_metrics`
(
    `timestamp` DateTime64(9, 'UTC'),
    `device_id` Int64,
    `context_id` Int64,
    `records` Array(Tuple(cubin_crc Int64, function_name String, function_index Int64, pc_offset Int64, values Map(String, Array(Int64)))),
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `device_uuid` LowCardinality(Nullable(String)),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`timestamp`)
ORDER BY (`job`, `host`, `pid`, `timestamp`)
TTL toDateTime(`timestamp`) + INTERVAL 14 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `sass_metrics_mv` TO `sass_metrics` AS
SELECT
    fromUnixTimestamp64Nano(`cuptistream_rows`.`timestamp`, 'UTC') AS `timestamp`,
    `cuptistream_rows`.`device_id` AS `device_id`,
    `cuptistream_rows`.`context_id` AS `context_id`,
    JSONExtract(`cuptistream_rows`.`records`, 'Array(Tuple(cubin_crc Int64, function_name String, function_index Int64, pc_offset Int64, values Map(String, Array(Int64))))') AS `records`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`device_uuid` AS `device_uuid`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'sass_metrics';

-- pm_samples: cuptistream.events.PmSamples
CREATE TABLE IF NOT EXISTS `pm_samples`
(
    `device_id` Int64,
    `chip` LowCardinality(String),
    `metrics` Array(String),
    `starts` Array(Int64),
    `ends` Array(Int64),
    `values` Array(Array(Nullable(Float64))),
    `received` DateTime64(9, 'UTC') DEFAULT now64(9, 'UTC'),
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `device_uuid` LowCardinality(Nullable(String)),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`received`)
ORDER BY (`job`, `host`, `pid`, `received`)
TTL toDateTime(`received`) + INTERVAL 14 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `pm_samples_mv` TO `pm_samples` AS
SELECT
    `cuptistream_rows`.`device_id` AS `device_id`,
    `cuptistream_rows`.`chip` AS `chip`,
    JSONExtract(`cuptistream_rows`.`metrics`, 'Array(String)') AS `metrics`,
    JSONExtract(`cuptistream_rows`.`starts`, 'Array(Int64)') AS `starts`,
    JSONExtract(`cuptistream_rows`.`ends`, 'Array(Int64)') AS `ends`,
    JSONExtract(`cuptistream_rows`.`values`, 'Array(Array(Nullable(Float64)))') AS `values`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`device_uuid` AS `device_uuid`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'pm_samples';

-- kernel_metrics: cuptistream.events.KernelMetrics
CREATE TABLE IF NOT EXISTS `kernel_metrics`
(
    `start` DateTime64(9, 'UTC'),
    `end` DateTime64(9, 'UTC'),
    `device_id` Int64,
    `chip` LowCardinality(String),
    `metrics` Array(String),
    `passes` Int64,
    `names` Array(String),
    `launches` Array(Int64),
    `values` Array(Array(Nullable(Float64))),
    `not_profiled` Int64,
    `duration_ns` Int64,
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `device_uuid` LowCardinality(Nullable(String)),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`start`)
ORDER BY (`job`, `host`, `pid`, `start`)
TTL toDateTime(`start`) + INTERVAL 14 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `kernel_metrics_mv` TO `kernel_metrics` AS
SELECT
    fromUnixTimestamp64Nano(`cuptistream_rows`.`start`, 'UTC') AS `start`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`end`, 'UTC') AS `end`,
    `cuptistream_rows`.`device_id` AS `device_id`,
    `cuptistream_rows`.`chip` AS `chip`,
    JSONExtract(`cuptistream_rows`.`metrics`, 'Array(String)') AS `metrics`,
    `cuptistream_rows`.`passes` AS `passes`,
    JSONExtract(`cuptistream_rows`.`names`, 'Array(String)') AS `names`,
    JSONExtract(`cuptistream_rows`.`launches`, 'Array(Int64)') AS `launches`,
    JSONExtract(`cuptistream_rows`.`values`, 'Array(Array(Nullable(Float64)))') AS `values`,
    `cuptistream_rows`.`not_profiled` AS `not_profiled`,
    `cuptistream_rows`.`end` - `cuptistream_rows`.`start` AS `duration_ns`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`device_uuid` AS `device_uuid`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'kernel_metrics';

-- governor: cuptistream.events.GovernorDecision
CREATE TABLE IF NOT EXISTS `governor`
(
    `timestamp` DateTime64(9, 'UTC'),
    `source` LowCardinality(String),
    `budget` Float64,
    `share` Float64,
    `window_s` Float64,
    `pause_s` Float64,
    `duty` Float64,
    `unit_cost` Float64,
    `expected_cost` Float64,
    `measured_open_s` Float64,
    `measured_host_s` Float64,
    `estimated_gpu_s` Float64,
    `windows` Int64,
    `reason` LowCardinality(String),
    `per_window` Bool,
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`timestamp`)
ORDER BY (`job`, `host`, `pid`, `timestamp`)
TTL toDateTime(`timestamp`) + INTERVAL 400 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `governor_mv` TO `governor` AS
SELECT
    fromUnixTimestamp64Nano(`cuptistream_rows`.`timestamp`, 'UTC') AS `timestamp`,
    `cuptistream_rows`.`source` AS `source`,
    `cuptistream_rows`.`budget` AS `budget`,
    `cuptistream_rows`.`share` AS `share`,
    `cuptistream_rows`.`window_s` AS `window_s`,
    `cuptistream_rows`.`pause_s` AS `pause_s`,
    `cuptistream_rows`.`duty` AS `duty`,
    `cuptistream_rows`.`unit_cost` AS `unit_cost`,
    `cuptistream_rows`.`expected_cost` AS `expected_cost`,
    `cuptistream_rows`.`measured_open_s` AS `measured_open_s`,
    `cuptistream_rows`.`measured_host_s` AS `measured_host_s`,
    `cuptistream_rows`.`estimated_gpu_s` AS `estimated_gpu_s`,
    `cuptistream_rows`.`windows` AS `windows`,
    `cuptistream_rows`.`reason` AS `reason`,
    `cuptistream_rows`.`per_window` AS `per_window`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'governor';

-- cupti_yield: cuptistream.events.CuptiYield
CREATE TABLE IF NOT EXISTS `cupti_yield`
(
    `tool` LowCardinality(String),
    `start` DateTime64(9, 'UTC'),
    `end` DateTime64(9, 'UTC'),
    `missed` Array(String),
    `standby` Array(String),
    `holder` LowCardinality(String),
    `reason` LowCardinality(String),
    `duration_ns` Int64,
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`start`)
ORDER BY (`job`, `host`, `pid`, `start`)
TTL toDateTime(`start`) + INTERVAL 400 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `cupti_yield_mv` TO `cupti_yield` AS
SELECT
    `cuptistream_rows`.`tool` AS `tool`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`start`, 'UTC') AS `start`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`end`, 'UTC') AS `end`,
    JSONExtract(`cuptistream_rows`.`missed`, 'Array(String)') AS `missed`,
    JSONExtract(`cuptistream_rows`.`standby`, 'Array(String)') AS `standby`,
    `cuptistream_rows`.`holder` AS `holder`,
    `cuptistream_rows`.`reason` AS `reason`,
    `cuptistream_rows`.`end` - `cuptistream_rows`.`start` AS `duration_ns`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'cupti_yield';

-- trace_window: cuptistream.events.TraceWindow
CREATE TABLE IF NOT EXISTS `trace_window`
(
    `source` LowCardinality(String),
    `window` Int64,
    `start` DateTime64(9, 'UTC'),
    `end` DateTime64(9, 'UTC'),
    `kinds` Array(String),
    `records` Int64,
    `on_demand` Bool,
    `request` Int64,
    `fresh` Bool,
    `duration_ns` Int64,
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`start`)
ORDER BY (`job`, `host`, `pid`, `start`)
TTL toDateTime(`start`) + INTERVAL 400 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `trace_window_mv` TO `trace_window` AS
SELECT
    `cuptistream_rows`.`source` AS `source`,
    `cuptistream_rows`.`window` AS `window`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`start`, 'UTC') AS `start`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`end`, 'UTC') AS `end`,
    JSONExtract(`cuptistream_rows`.`kinds`, 'Array(String)') AS `kinds`,
    JSONExtract(`cuptistream_rows`.`records`, 'Int64') AS `records`,
    `cuptistream_rows`.`on_demand` AS `on_demand`,
    `cuptistream_rows`.`request` AS `request`,
    `cuptistream_rows`.`fresh` AS `fresh`,
    `cuptistream_rows`.`end` - `cuptistream_rows`.`start` AS `duration_ns`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'trace_window';

-- stack_table: cuptistream.events.StackTable
CREATE TABLE IF NOT EXISTS `stack_table`
(
    `process_id` Int64,
    `frame_ids` Array(Int64),
    `files` Array(String),
    `functions` Array(String),
    `lines` Array(Int64),
    `stack_ids` Array(Int64),
    `stacks` Array(Array(Int64)),
    `received` DateTime64(9, 'UTC') DEFAULT now64(9, 'UTC'),
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`received`)
ORDER BY (`job`, `host`, `pid`, `received`)
TTL toDateTime(`received`) + INTERVAL 400 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `stack_table_mv` TO `stack_table` AS
SELECT
    `cuptistream_rows`.`process_id` AS `process_id`,
    JSONExtract(`cuptistream_rows`.`frame_ids`, 'Array(Int64)') AS `frame_ids`,
    JSONExtract(`cuptistream_rows`.`files`, 'Array(String)') AS `files`,
    JSONExtract(`cuptistream_rows`.`functions`, 'Array(String)') AS `functions`,
    JSONExtract(`cuptistream_rows`.`lines`, 'Array(Int64)') AS `lines`,
    JSONExtract(`cuptistream_rows`.`stack_ids`, 'Array(Int64)') AS `stack_ids`,
    JSONExtract(`cuptistream_rows`.`stacks`, 'Array(Array(Int64))') AS `stacks`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'stack_table';

-- stack_changes: cuptistream.events.StackChanges
CREATE TABLE IF NOT EXISTS `stack_changes`
(
    `process_id` Int64,
    `interval_ns` Int64,
    `thread_ids` Array(Int64),
    `times` Array(Int64),
    `stack_ids` Array(Int64),
    `previous` Array(Int64),
    `received` DateTime64(9, 'UTC') DEFAULT now64(9, 'UTC'),
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`received`)
ORDER BY (`job`, `host`, `pid`, `received`)
TTL toDateTime(`received`) + INTERVAL 14 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `stack_changes_mv` TO `stack_changes` AS
SELECT
    `cuptistream_rows`.`process_id` AS `process_id`,
    `cuptistream_rows`.`interval_ns` AS `interval_ns`,
    JSONExtract(`cuptistream_rows`.`thread_ids`, 'Array(Int64)') AS `thread_ids`,
    JSONExtract(`cuptistream_rows`.`times`, 'Array(Int64)') AS `times`,
    JSONExtract(`cuptistream_rows`.`stack_ids`, 'Array(Int64)') AS `stack_ids`,
    JSONExtract(`cuptistream_rows`.`previous`, 'Array(Int64)') AS `previous`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'stack_changes';

-- activity_stats: cuptistream.events.ActivityStats
CREATE TABLE IF NOT EXISTS `activity_stats`
(
    `interval_start` DateTime64(9, 'UTC'),
    `interval_end` DateTime64(9, 'UTC'),
    `device_id` Int64,
    `category` LowCardinality(String),
    `name` LowCardinality(String),
    `count` Int64,
    `total_ns` Int64,
    `durations` Tuple(scale Int64, offset Int64, counts Array(Int64), zero_count Int64, min Int64, max Int64),
    `traced_ns` Int64,
    `estimated` Bool,
    `estimated_count` Int64,
    `estimated_total_ns` Int64,
    `bytes` Int64,
    `estimated_bytes` Int64,
    `nccl` Bool,
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `device_uuid` LowCardinality(Nullable(String)),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`interval_start`)
ORDER BY (`job`, `host`, `pid`, `interval_start`)
TTL toDateTime(`interval_start`) + INTERVAL 400 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `activity_stats_mv` TO `activity_stats` AS
SELECT
    fromUnixTimestamp64Nano(`cuptistream_rows`.`interval_start`, 'UTC') AS `interval_start`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`interval_end`, 'UTC') AS `interval_end`,
    `cuptistream_rows`.`device_id` AS `device_id`,
    `cuptistream_rows`.`category` AS `category`,
    `cuptistream_rows`.`name` AS `name`,
    `cuptistream_rows`.`count` AS `count`,
    `cuptistream_rows`.`total_ns` AS `total_ns`,
    JSONExtract(`cuptistream_rows`.`durations`, 'Tuple(scale Int64, offset Int64, counts Array(Int64), zero_count Int64, min Int64, max Int64)') AS `durations`,
    `cuptistream_rows`.`traced_ns` AS `traced_ns`,
    `cuptistream_rows`.`estimated` AS `estimated`,
    `cuptistream_rows`.`estimated_count` AS `estimated_count`,
    `cuptistream_rows`.`estimated_total_ns` AS `estimated_total_ns`,
    `cuptistream_rows`.`bytes` AS `bytes`,
    `cuptistream_rows`.`estimated_bytes` AS `estimated_bytes`,
    `cuptistream_rows`.`nccl` AS `nccl`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`device_uuid` AS `device_uuid`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'activity_stats';

-- stack_stats: cuptistream.events.StackStats
CREATE TABLE IF NOT EXISTS `stack_stats`
(
    `interval_start` DateTime64(9, 'UTC'),
    `interval_end` DateTime64(9, 'UTC'),
    `device_id` Int64,
    `process_id` Int64,
    `traced_ns` Int64,
    `stack_ids` Array(Int64),
    `gpu_ns` Array(Int64),
    `launches` Array(Int64),
    `estimated` Bool,
    `estimated_gpu_ns` Array(Int64),
    `estimated_launches` Array(Int64),
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `device_uuid` LowCardinality(Nullable(String)),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`interval_start`)
ORDER BY (`job`, `host`, `pid`, `interval_start`)
TTL toDateTime(`interval_start`) + INTERVAL 400 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `stack_stats_mv` TO `stack_stats` AS
SELECT
    fromUnixTimestamp64Nano(`cuptistream_rows`.`interval_start`, 'UTC') AS `interval_start`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`interval_end`, 'UTC') AS `interval_end`,
    `cuptistream_rows`.`device_id` AS `device_id`,
    `cuptistream_rows`.`process_id` AS `process_id`,
    `cuptistream_rows`.`traced_ns` AS `traced_ns`,
    JSONExtract(`cuptistream_rows`.`stack_ids`, 'Array(Int64)') AS `stack_ids`,
    JSONExtract(`cuptistream_rows`.`gpu_ns`, 'Array(Int64)') AS `gpu_ns`,
    JSONExtract(`cuptistream_rows`.`launches`, 'Array(Int64)') AS `launches`,
    `cuptistream_rows`.`estimated` AS `estimated`,
    JSONExtract(`cuptistream_rows`.`estimated_gpu_ns`, 'Array(Int64)') AS `estimated_gpu_ns`,
    JSONExtract(`cuptistream_rows`.`estimated_launches`, 'Array(Int64)') AS `estimated_launches`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`device_uuid` AS `device_uuid`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'stack_stats';

-- gpu_stats: cuptistream.events.GpuStats
CREATE TABLE IF NOT EXISTS `gpu_stats`
(
    `interval_start` DateTime64(9, 'UTC'),
    `interval_end` DateTime64(9, 'UTC'),
    `device_id` Int64,
    `traced_ns` Int64,
    `traced_fraction` Float64,
    `busy_ns` Int64,
    `busy_fraction` Float64,
    `kernel_ns` Int64,
    `nccl_ns` Int64,
    `copy_ns` Int64,
    `memset_ns` Int64,
    `kernels` Int64,
    `copies` Int64,
    `memsets` Int64,
    `copy_bytes` Int64,
    `estimated` Bool,
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `device_uuid` LowCardinality(Nullable(String)),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`interval_start`)
ORDER BY (`job`, `host`, `pid`, `interval_start`)
TTL toDateTime(`interval_start`) + INTERVAL 400 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `gpu_stats_mv` TO `gpu_stats` AS
SELECT
    fromUnixTimestamp64Nano(`cuptistream_rows`.`interval_start`, 'UTC') AS `interval_start`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`interval_end`, 'UTC') AS `interval_end`,
    `cuptistream_rows`.`device_id` AS `device_id`,
    `cuptistream_rows`.`traced_ns` AS `traced_ns`,
    `cuptistream_rows`.`traced_fraction` AS `traced_fraction`,
    `cuptistream_rows`.`busy_ns` AS `busy_ns`,
    `cuptistream_rows`.`busy_fraction` AS `busy_fraction`,
    `cuptistream_rows`.`kernel_ns` AS `kernel_ns`,
    `cuptistream_rows`.`nccl_ns` AS `nccl_ns`,
    `cuptistream_rows`.`copy_ns` AS `copy_ns`,
    `cuptistream_rows`.`memset_ns` AS `memset_ns`,
    `cuptistream_rows`.`kernels` AS `kernels`,
    `cuptistream_rows`.`copies` AS `copies`,
    `cuptistream_rows`.`memsets` AS `memsets`,
    `cuptistream_rows`.`copy_bytes` AS `copy_bytes`,
    `cuptistream_rows`.`estimated` AS `estimated`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`device_uuid` AS `device_uuid`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'gpu_stats';

-- pm_stats: cuptistream.events.PmStats
CREATE TABLE IF NOT EXISTS `pm_stats`
(
    `interval_start` DateTime64(9, 'UTC'),
    `interval_end` DateTime64(9, 'UTC'),
    `device_id` Int64,
    `samples` Int64,
    `metrics` Array(String),
    `mean` Array(Nullable(Float64)),
    `p5` Array(Nullable(Float64)),
    `p50` Array(Nullable(Float64)),
    `p95` Array(Nullable(Float64)),
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `device_uuid` LowCardinality(Nullable(String)),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`interval_start`)
ORDER BY (`job`, `host`, `pid`, `interval_start`)
TTL toDateTime(`interval_start`) + INTERVAL 14 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `pm_stats_mv` TO `pm_stats` AS
SELECT
    fromUnixTimestamp64Nano(`cuptistream_rows`.`interval_start`, 'UTC') AS `interval_start`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`interval_end`, 'UTC') AS `interval_end`,
    `cuptistream_rows`.`device_id` AS `device_id`,
    JSONExtract(`cuptistream_rows`.`samples`, 'Int64') AS `samples`,
    JSONExtract(`cuptistream_rows`.`metrics`, 'Array(String)') AS `metrics`,
    JSONExtract(`cuptistream_rows`.`mean`, 'Array(Nullable(Float64))') AS `mean`,
    JSONExtract(`cuptistream_rows`.`p5`, 'Array(Nullable(Float64))') AS `p5`,
    JSONExtract(`cuptistream_rows`.`p50`, 'Array(Nullable(Float64))') AS `p50`,
    JSONExtract(`cuptistream_rows`.`p95`, 'Array(Nullable(Float64))') AS `p95`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`device_uuid` AS `device_uuid`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'pm_stats';

-- pm_kernel_stats: cuptistream.events.PmKernelStats
CREATE TABLE IF NOT EXISTS `pm_kernel_stats`
(
    `interval_start` DateTime64(9, 'UTC'),
    `interval_end` DateTime64(9, 'UTC'),
    `device_id` Int64,
    `name` LowCardinality(String),
    `kernel_ns` Int64,
    `covered_ns` Int64,
    `covered_share` Float64,
    `samples` Int64,
    `metrics` Array(String),
    `mean` Array(Nullable(Float64)),
    `own_share` Float64,
    `all_share` Float64,
    `traced_ns` Int64,
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `device_uuid` LowCardinality(Nullable(String)),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`interval_start`)
ORDER BY (`job`, `host`, `pid`, `interval_start`)
TTL toDateTime(`interval_start`) + INTERVAL 14 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `pm_kernel_stats_mv` TO `pm_kernel_stats` AS
SELECT
    fromUnixTimestamp64Nano(`cuptistream_rows`.`interval_start`, 'UTC') AS `interval_start`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`interval_end`, 'UTC') AS `interval_end`,
    `cuptistream_rows`.`device_id` AS `device_id`,
    `cuptistream_rows`.`name` AS `name`,
    `cuptistream_rows`.`kernel_ns` AS `kernel_ns`,
    `cuptistream_rows`.`covered_ns` AS `covered_ns`,
    `cuptistream_rows`.`covered_share` AS `covered_share`,
    JSONExtract(`cuptistream_rows`.`samples`, 'Int64') AS `samples`,
    JSONExtract(`cuptistream_rows`.`metrics`, 'Array(String)') AS `metrics`,
    JSONExtract(`cuptistream_rows`.`mean`, 'Array(Nullable(Float64))') AS `mean`,
    `cuptistream_rows`.`own_share` AS `own_share`,
    `cuptistream_rows`.`all_share` AS `all_share`,
    `cuptistream_rows`.`traced_ns` AS `traced_ns`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`device_uuid` AS `device_uuid`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'pm_kernel_stats';

-- loss: cuptistream.events.Loss
CREATE TABLE IF NOT EXISTS `loss`
(
    `stage` LowCardinality(String),
    `reason` LowCardinality(String),
    `count` Int64,
    `since` DateTime64(9, 'UTC'),
    `until` DateTime64(9, 'UTC'),
    `unit` LowCardinality(String),
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`since`)
ORDER BY (`job`, `host`, `pid`, `since`)
TTL toDateTime(`since`) + INTERVAL 400 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `loss_mv` TO `loss` AS
SELECT
    `cuptistream_rows`.`stage` AS `stage`,
    `cuptistream_rows`.`reason` AS `reason`,
    `cuptistream_rows`.`count` AS `count`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`since`, 'UTC') AS `since`,
    fromUnixTimestamp64Nano(`cuptistream_rows`.`until`, 'UTC') AS `until`,
    ifNull(`cuptistream_rows`.`unit`, 'events') AS `unit`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'loss';

-- self_stats: cuptistream.events.SelfStats
CREATE TABLE IF NOT EXISTS `self_stats`
(
    `timestamp` DateTime64(9, 'UTC'),
    `stages` Map(String, Tuple(events_in Int64, events_out Int64, events_dropped Int64, events_delivered Int64, events_spooled Int64, bytes_in Int64, bytes_out Int64, queued_bytes Int64, counters Map(String, Int64))),
    `session_id` LowCardinality(String),
    `seq` UInt64,
    `schema_version` UInt16,
    `host` LowCardinality(String),
    `pid` UInt32,
    `ppid` UInt32,
    `process_name` LowCardinality(String),
    `rank` Nullable(UInt32),
    `local_rank` Nullable(UInt32),
    `world_size` Nullable(UInt32),
    `attributes` Map(LowCardinality(String), String),
    `job` LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(`timestamp`)
ORDER BY (`job`, `host`, `pid`, `timestamp`)
TTL toDateTime(`timestamp`) + INTERVAL 400 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS `self_stats_mv` TO `self_stats` AS
SELECT
    fromUnixTimestamp64Nano(`cuptistream_rows`.`timestamp`, 'UTC') AS `timestamp`,
    JSONExtract(`cuptistream_rows`.`stages`, 'Map(String, Tuple(events_in Int64, events_out Int64, events_dropped Int64, events_delivered Int64, events_spooled Int64, bytes_in Int64, bytes_out Int64, queued_bytes Int64, counters Map(String, Int64)))') AS `stages`,
    `cuptistream_rows`.`session_id` AS `session_id`,
    `cuptistream_rows`.`seq` AS `seq`,
    `cuptistream_rows`.`schema_version` AS `schema_version`,
    `cuptistream_rows`.`host` AS `host`,
    `cuptistream_rows`.`pid` AS `pid`,
    `cuptistream_rows`.`ppid` AS `ppid`,
    `cuptistream_rows`.`process_name` AS `process_name`,
    `cuptistream_rows`.`rank` AS `rank`,
    `cuptistream_rows`.`local_rank` AS `local_rank`,
    `cuptistream_rows`.`world_size` AS `world_size`,
    `cuptistream_rows`.`attributes` AS `attributes`,
    if(`cuptistream_rows`.`attributes`['job'] != '', `cuptistream_rows`.`attributes`['job'], `cuptistream_rows`.`session_id`) AS `job`
FROM `cuptistream_rows`
WHERE `type` = 'self_stats';
