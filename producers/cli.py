"""`streamtrain produce …` and `streamtrain join`: flags are read here and nowhere else.

Heavy imports (confluent-kafka, pyarrow) stay inside the commands, so `streamtrain --help`
stays fast.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Optional

import typer

from streamtrain.infra.signals import stop_on_signals

produce_app = typer.Typer(help="Write records to Kafka: a synthetic click log, or a file replay.",
                          no_args_is_help=True)

RateOpt = Annotated[float, typer.Option("--rate", help="Records per second (0 = as fast as Kafka takes them).")]
PartitionsOpt = Annotated[int, typer.Option(
    "--partitions", help="Partitions of topics this command creates (existing topics are left as they are).")]


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s")


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


@produce_app.command("synthetic")
def synthetic_cmd(
    impressions_topic: Annotated[str, typer.Option(
        "--impressions-topic", help="Topic of impressions (click-log mode).")] = "impressions",
    clicks_topic: Annotated[str, typer.Option("--clicks-topic", help="Topic of clicks (click-log mode).")] = "clicks",
    labelled: Annotated[bool, typer.Option(
        "--labelled", help="Write labelled examples to --topic instead of a click log.")] = False,
    topic: Annotated[Optional[str], typer.Option(
        "--topic", help="Topic of labelled examples; implies --labelled (default: examples).",
        show_default=False)] = None,
    rate: RateOpt = 1000.0,
    count: Annotated[Optional[int], typer.Option(
        "--count", help="Impressions to write, then wait for their clicks and stop (default: unbounded).",
        show_default=False)] = None,
    start: Annotated[int, typer.Option("--start", help="Index of the first impression.")] = 0,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the click model.")] = 7,
    drift_every: Annotated[int, typer.Option(
        "--drift-every", help="Redraw a share of the model's weights every N impressions (0 = never).")] = 0,
    click_delay_median_s: Annotated[float, typer.Option(
        "--click-delay-median-s", help="Median delay of a click after its impression (log-normal).")] = 3.0,
    max_click_delay_s: Annotated[float, typer.Option(
        "--max-click-delay-s", help="Clicks later than this never happen.")] = 30.0,
    partitions: PartitionsOpt = 1,
) -> None:
    """A synthetic click log from a known model: impressions now, each click after a realistic
    delay, keyed by impression id; or, with --labelled, examples ready to train on."""
    from streamtrain.infra import Endpoints
    from streamtrain.infra.clients import TopicSpec, ensure_topics
    from streamtrain.producers.clickmodel import ClickModelConfig
    from streamtrain.producers.errors import ProducerError
    from streamtrain.producers.sink import KafkaSink
    from streamtrain.producers.synthetic import SyntheticSource, SyntheticSourceConfig

    labelled = labelled or topic is not None
    try:
        config = SyntheticSourceConfig(
            impressions_topic=None if labelled else impressions_topic,
            clicks_topic=None if labelled else clicks_topic,
            examples_topic=(topic or "examples") if labelled else None,
            rate=rate, count=count, start=start, max_click_delay_ms=round(max_click_delay_s * 1000),
            model=ClickModelConfig(seed=seed, drift_every=drift_every,
                                   click_delay_median_ms=click_delay_median_s * 1000),
        )
    except ValueError as exc:
        raise _fail(str(exc), 2) from exc
    endpoints = Endpoints.resolve()
    names = [t for t in (config.impressions_topic, config.clicks_topic, config.examples_topic) if t]
    stop = stop_on_signals()
    try:
        ensure_topics(endpoints, [TopicSpec(t, partitions) for t in names])
        stats = SyntheticSource(config, KafkaSink(endpoints.kafka)).run(stop)
    except ProducerError as exc:
        raise _fail(str(exc)) from exc
    typer.echo(f"impressions {stats.impressions}  clicks {stats.clicks}  examples {stats.examples}  "
               f"clicks dropped {stats.clicks_dropped}")


@produce_app.command("file")
def file_cmd(
    path: Annotated[Path, typer.Argument(help="CSV, Parquet or JSON-lines file.", show_default=False)],
    topic: Annotated[str, typer.Option("--topic", help="Topic to write the rows to.")],
    rate: RateOpt = 0.0,
    loop: Annotated[bool, typer.Option("--loop", help="Start over at the end, until stopped.")] = False,
    fmt: Annotated[Optional[str], typer.Option(
        "--format", help="csv, parquet or jsonl (default: from the suffix).", show_default=False)] = None,
    value: Annotated[str, typer.Option(
        "--value", help="Record value: json (an object per row) or csv (the line).")] = "json",
    key: Annotated[Optional[str], typer.Option(
        "--key", help="Column whose value becomes the record key (default: no key).", show_default=False)] = None,
    partitions: PartitionsOpt = 1,
    header: Annotated[bool, typer.Option(
        "--header/--no-header", help="CSV: whether the first line names the columns. Without a header every "
        "line is a row, its columns named by --columns or f0, f1, ...")] = True,
    columns: Annotated[Optional[str], typer.Option(
        "--columns", help="CSV: the column names, comma-separated, in file order; with --header they replace "
        "the header's.", show_default=False)] = None,
) -> None:
    """Replay a file onto a topic, one record per row, streaming in batches."""
    from streamtrain.infra import Endpoints
    from streamtrain.infra.clients import TopicSpec, ensure_topics
    from streamtrain.producers.errors import ProducerError
    from streamtrain.producers.replay import FileReplay, ReplayConfig
    from streamtrain.producers.sink import KafkaSink

    try:
        config = ReplayConfig(path, topic, format=fmt, rate=rate, loop=loop, value=value, key_column=key,
                              header=header, columns=None if columns is None else tuple(columns.split(",")))
    except ValueError as exc:
        raise _fail(str(exc), 2) from exc
    endpoints = Endpoints.resolve()
    stop = stop_on_signals()
    try:
        ensure_topics(endpoints, [TopicSpec(topic, partitions)])
        stats = FileReplay(config, KafkaSink(endpoints.kafka)).run(stop)
    except ProducerError as exc:
        raise _fail(str(exc)) from exc
    typer.echo(f"rows {stats.rows}  passes {stats.passes}")


def join_cmd(
    impressions: Annotated[str, typer.Option("--impressions", help="Topic of impressions.")] = "impressions",
    clicks: Annotated[str, typer.Option("--clicks", help="Topic of clicks.")] = "clicks",
    output: Annotated[str, typer.Option("--output", help="Topic of the labelled examples.")] = "examples",
    window_s: Annotated[float, typer.Option(
        "--window-s",
        help="Attribution window: a click this long after its impression, or sooner, makes label 1.")] = 10.0,
    group: Annotated[Optional[str], typer.Option(
        "--group", help="Consumer group and transactional id prefix (default: join-OUTPUT). "
        "Restart with the same group to resume exactly where the last run committed.",
        show_default=False)] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Join impressions with their clicks into labelled examples, exactly once across restarts:
    label 1 when the click comes within the window, label 0 when the window closes without one."""
    from streamtrain.infra import Endpoints
    from streamtrain.producers.errors import ProducerError
    from streamtrain.producers.joiner import Joiner, JoinerConfig

    _setup_logging(verbose)
    try:
        config = JoinerConfig(impressions, clicks, output, window_ms=round(window_s * 1000),
                              group=group or f"join-{output}")
    except ValueError as exc:
        raise _fail(str(exc), 2) from exc
    stop = stop_on_signals()
    try:
        Joiner(config, Endpoints.resolve().kafka).run(stop)
    except ProducerError as exc:
        raise _fail(str(exc)) from exc
