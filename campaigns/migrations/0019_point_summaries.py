"""Per-point summaries of the aggregate results (campaigns.models.PointSummary), kept by PostgreSQL.

``campaigns_pointsummary_live`` is the definition: the statistics compare and the campaign statistics computed from
every repetition until now (count, avg, stddev_samp, min, max, percentile_cont(0.5) per campaign, point, metric name
and labels' jsonb text, over the aggregate results of succeeded measured runs), with the parameters of the point's
first counted run. ``campaigns_point_summary_refresh(campaign, point)`` replaces one point's rows of the table with
the view's. Triggers call it, in the writing transaction, for every point whose results change or whose set of
counted runs changes (a run succeeding, created succeeded, deleted), whoever writes: services, the ORM, raw SQL.

Two transactions refreshing one point take turns (an advisory lock held until each commits): under READ COMMITTED
each statement after the lock sees what the other committed, so the last refresh of a point counts every run. Under
REPEATABLE READ a late refresh fails on the unique constraint instead of writing stale rows.

The table is filled from the view here. SQLite gets the empty table and no triggers (its statistics come from the
rows: campaigns.baselines.summaries_in_sql).
"""

import django.db.models.deletion
from django.db import migrations, models


COUNTED = "status = 'succeeded' AND NOT is_warmup"  # a run whose aggregate results are statistics
AGGREGATE = "host = '' AND NOT labels ? 'job'"  # the aggregate across hosts, not a per-job row

FORWARD = f"""
CREATE VIEW campaigns_pointsummary_live AS
SELECT s.campaign_id, s.point, f.params, s.name, s.labels_text, s.unit, s.n, s.mean, s.stdev, s.low, s.high, s.median
FROM (
    SELECT r.campaign_id, r.point, res.name, res.labels::text AS labels_text, max(res.unit) AS unit,
           count(*) AS n, avg(res.value) AS mean, stddev_samp(res.value) AS stdev, min(res.value) AS low,
           max(res.value) AS high, percentile_cont(0.5) WITHIN GROUP (ORDER BY res.value) AS median
    FROM campaigns_result res JOIN campaigns_run r ON r.id = res.run_id
    WHERE r.status = 'succeeded' AND NOT r.is_warmup AND res.host = '' AND NOT res.labels ? 'job'
    GROUP BY r.campaign_id, r.point, res.name, res.labels::text
) s JOIN (
    SELECT DISTINCT ON (campaign_id, point) campaign_id, point, params FROM campaigns_run
    WHERE {COUNTED} ORDER BY campaign_id, point, id
) f ON f.campaign_id = s.campaign_id AND f.point = s.point;

-- Planned for each call's point (force_custom_plan): a plan the session cached while the tables were small would
-- read every result of every campaign for one point once they are not (seen: 0.2 s a refresh at 240,000 results).
CREATE FUNCTION campaigns_point_summary_refresh(c bigint, p integer) RETURNS void LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('campaigns_pointsummary ' || c || ' ' || p, 0));
    DELETE FROM campaigns_pointsummary WHERE campaign_id = c AND point = p;
    INSERT INTO campaigns_pointsummary
        (campaign_id, point, params, name, labels_text, unit, n, mean, stdev, low, high, median)
    SELECT campaign_id, point, params, name, labels_text, unit, n, mean, stdev, low, high, median
    FROM campaigns_pointsummary_live WHERE campaign_id = c AND point = p;
END $$;

-- Results: the points of the counted runs whose aggregate results a statement inserted, updated or deleted, in
-- one order (two statements never lock each other's points the other way round).
CREATE FUNCTION campaigns_result_summaries() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    runs bigint[] := '{{}}';
    p record;
BEGIN
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        runs := runs || ARRAY(SELECT run_id FROM new_results WHERE {AGGREGATE});
    END IF;
    IF TG_OP IN ('DELETE', 'UPDATE') THEN
        runs := runs || ARRAY(SELECT run_id FROM old_results WHERE {AGGREGATE});
    END IF;
    FOR p IN SELECT DISTINCT campaign_id, point FROM campaigns_run
             WHERE id IN (SELECT unnest(runs)) AND {COUNTED} ORDER BY 1, 2 LOOP
        PERFORM campaigns_point_summary_refresh(p.campaign_id, p.point);
    END LOOP;
    RETURN NULL;
END $$;
CREATE TRIGGER campaigns_result_summaries_insert AFTER INSERT ON campaigns_result
    REFERENCING NEW TABLE AS new_results FOR EACH STATEMENT EXECUTE FUNCTION campaigns_result_summaries();
CREATE TRIGGER campaigns_result_summaries_update AFTER UPDATE ON campaigns_result
    REFERENCING OLD TABLE AS old_results NEW TABLE AS new_results
    FOR EACH STATEMENT EXECUTE FUNCTION campaigns_result_summaries();
CREATE TRIGGER campaigns_result_summaries_delete AFTER DELETE ON campaigns_result
    REFERENCING OLD TABLE AS old_results FOR EACH STATEMENT EXECUTE FUNCTION campaigns_result_summaries();

-- Runs created or deleted: the points of the counted ones (a campaign's deletion empties its points this way).
CREATE FUNCTION campaigns_runs_summaries() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    p record;
BEGIN
    IF TG_OP = 'INSERT' THEN
        FOR p IN SELECT DISTINCT campaign_id, point FROM new_runs WHERE {COUNTED} ORDER BY 1, 2 LOOP
            PERFORM campaigns_point_summary_refresh(p.campaign_id, p.point);
        END LOOP;
    ELSE
        FOR p IN SELECT DISTINCT campaign_id, point FROM old_runs WHERE {COUNTED} ORDER BY 1, 2 LOOP
            PERFORM campaigns_point_summary_refresh(p.campaign_id, p.point);
        END LOOP;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER campaigns_run_summaries_insert AFTER INSERT ON campaigns_run
    REFERENCING NEW TABLE AS new_runs FOR EACH STATEMENT EXECUTE FUNCTION campaigns_runs_summaries();
CREATE TRIGGER campaigns_run_summaries_delete AFTER DELETE ON campaigns_run
    REFERENCING OLD TABLE AS old_runs FOR EACH STATEMENT EXECUTE FUNCTION campaigns_runs_summaries();

-- A run that starts or stops counting, or moves: its old and new points. Per row, and only when one side counts
-- and status, warm-up, point or campaign changed: the many updates of a run's other columns (heartbeats, leases,
-- provenance) never call it.
CREATE FUNCTION campaigns_run_summaries() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    p record;
BEGIN
    FOR p IN SELECT DISTINCT c, pt FROM (VALUES
                 (OLD.campaign_id, OLD.point, OLD.status = 'succeeded' AND NOT OLD.is_warmup),
                 (NEW.campaign_id, NEW.point, NEW.status = 'succeeded' AND NOT NEW.is_warmup)
             ) AS v (c, pt, counted) WHERE counted ORDER BY 1, 2 LOOP
        PERFORM campaigns_point_summary_refresh(p.c, p.pt);
    END LOOP;
    RETURN NULL;
END $$;
CREATE TRIGGER campaigns_run_summaries_update AFTER UPDATE OF status, is_warmup, point, campaign_id ON campaigns_run
    FOR EACH ROW WHEN (
        (OLD.status = 'succeeded' AND NOT OLD.is_warmup OR NEW.status = 'succeeded' AND NOT NEW.is_warmup)
        AND (OLD.status, OLD.is_warmup, OLD.point, OLD.campaign_id)
            IS DISTINCT FROM (NEW.status, NEW.is_warmup, NEW.point, NEW.campaign_id)
    ) EXECUTE FUNCTION campaigns_run_summaries();

INSERT INTO campaigns_pointsummary
    (campaign_id, point, params, name, labels_text, unit, n, mean, stdev, low, high, median)
SELECT campaign_id, point, params, name, labels_text, unit, n, mean, stdev, low, high, median
FROM campaigns_pointsummary_live;
"""

BACKWARD = """
DROP TRIGGER campaigns_run_summaries_update ON campaigns_run;
DROP TRIGGER campaigns_run_summaries_delete ON campaigns_run;
DROP TRIGGER campaigns_run_summaries_insert ON campaigns_run;
DROP TRIGGER campaigns_result_summaries_delete ON campaigns_result;
DROP TRIGGER campaigns_result_summaries_update ON campaigns_result;
DROP TRIGGER campaigns_result_summaries_insert ON campaigns_result;
DROP FUNCTION campaigns_run_summaries();
DROP FUNCTION campaigns_runs_summaries();
DROP FUNCTION campaigns_result_summaries();
DROP FUNCTION campaigns_point_summary_refresh(bigint, integer);
DROP VIEW campaigns_pointsummary_live;
"""


def triggers(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORWARD)


def no_triggers(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKWARD)


class Migration(migrations.Migration):

    dependencies = [
        ('campaigns', '0018_campaign_drift_report_suite_actions'),
    ]

    operations = [
        migrations.CreateModel(
            name='PointSummary',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('point', models.PositiveIntegerField()),
                ('params', models.JSONField(help_text="parameters of the point's first counted run (by id)")),
                ('name', models.CharField(max_length=100)),
                ('labels_text', models.TextField(help_text="the results' labels as PostgreSQL writes jsonb")),
                ('unit', models.CharField(help_text='max(unit) of the results', max_length=30)),
                ('n', models.PositiveIntegerField()),
                ('mean', models.FloatField()),
                ('stdev', models.FloatField(help_text='stddev_samp: null for one value', null=True)),
                ('low', models.FloatField()),
                ('high', models.FloatField()),
                ('median', models.FloatField(help_text='percentile_cont(0.5)')),
            ],
        ),
        migrations.AddIndex(
            model_name='result',
            index=models.Index(condition=models.Q(('host', '')), fields=['run'], name='result_aggregates'),
        ),
        migrations.AddIndex(
            model_name='run',
            index=models.Index(fields=['campaign', 'point', 'id'], name='run_campaign_point'),
        ),
        migrations.AddField(
            model_name='pointsummary',
            name='campaign',
            field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='campaigns.campaign'),
        ),
        migrations.AddConstraint(
            model_name='pointsummary',
            constraint=models.UniqueConstraint(fields=('campaign', 'point', 'name', 'labels_text'), name='pointsummary_unique'),
        ),
        migrations.RunPython(triggers, no_triggers),
    ]
