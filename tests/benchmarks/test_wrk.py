from __future__ import annotations

from pathlib import Path

import pytest

from torchbay.benchmarks import wrk
from torchbay.benchmarks.errors import BenchError

# wrk 4.1.0's report with --latency, captured from a run against a server that answered some 404s.
WRK_OUTPUT = """\
Running 20s test @ http://127.0.0.1:8080/predictions/tiny
  1 threads and 16 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     2.61ms    1.02ms  20.13ms   80.12%
    Req/Sec     5.72k   312.45     6.10k    85.00%
  Latency Distribution
     50%    2.60ms
     75%    3.01ms
     90%  812.00us
     99%    1.02s
  114512 requests in 20.01s, 20.31MB read
  Socket errors: connect 0, read 2, write 1, timeout 12
  Non-2xx or 3xx responses: 5
Requests/sec:   5722.36
Transfer/sec:      1.02MB
"""

CLEAN_OUTPUT = """\
Running 5s test @ http://127.0.0.1:40123/predictions/tiny
  1 threads and 16 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   461.13us  120.40us   4.88ms   90.10%
    Req/Sec    34.89k     1.20k   36.01k    88.00%
  Latency Distribution
     50%  408.00us
     75%  447.00us
     90%  652.00us
     99%  971.00us
  173655 requests in 5.00s, 24.67MB read
Requests/sec:  34717.62
Transfer/sec:      4.93MB
"""

MARKER = (
    "torchbay-wrk requests=173655 duration_us=5000123 non2xx=7 counted=1 p50_us=408.3 "
    "p75_us=447.9 p90_us=652.1 p99_us=971.4 p999_us=1928.0 max_us=4876.0\n"
)


def test_parse_full_report() -> None:
    result = wrk.parse_wrk_output(WRK_OUTPUT)
    assert result.requests == 114_512
    assert result.duration_s == pytest.approx(20.01)
    assert result.req_per_s == pytest.approx(5722.36)
    assert (result.p50_ms, result.p75_ms) == (pytest.approx(2.60), pytest.approx(3.01))
    assert result.p90_ms == pytest.approx(0.812)
    assert result.p99_ms == pytest.approx(1020.0)
    assert result.avg_ms == pytest.approx(2.61)
    assert result.max_ms == pytest.approx(20.13)
    assert result.non2xx == 5
    assert result.socket_errors == wrk.SocketErrors(connect=0, read=2, write=1, timeout=12)
    assert result.errors == 5 + 15
    assert result.p999_ms is None


def test_parse_clean_report_has_no_errors() -> None:
    result = wrk.parse_wrk_output(CLEAN_OUTPUT)
    assert result.errors == 0
    assert result.p99_ms == pytest.approx(0.971)
    assert result.avg_ms == pytest.approx(0.46113)


def test_marker_line_gives_exact_numbers_and_counted_non2xx() -> None:
    result = wrk.parse_wrk_output(CLEAN_OUTPUT + MARKER)
    assert result.non2xx == 7  # the Lua count (any status outside 200-299) wins
    assert result.p50_ms == pytest.approx(0.4083)
    assert result.p999_ms == pytest.approx(1.928)
    assert result.max_ms == pytest.approx(4.876)


def test_marker_without_counting_keeps_wrk_count() -> None:
    result = wrk.parse_wrk_output(WRK_OUTPUT + MARKER.replace("counted=1", "counted=0"))
    assert result.non2xx == 5


@pytest.mark.parametrize(
    ("text", "ms"),
    [("812.00us", 0.812), ("1.23ms", 1.23), ("1.02s", 1020.0), ("2.00m", 120_000.0), ("5s", 5e3)],
)
def test_time_units(text: str, ms: float) -> None:
    assert wrk.parse_time_ms(text) == pytest.approx(ms)


def test_unreadable_output_is_a_bench_error() -> None:
    with pytest.raises(BenchError):
        wrk.parse_wrk_output("unable to connect to 127.0.0.1:1 Connection refused\n")
    with pytest.raises(BenchError, match="--latency"):
        wrk.parse_wrk_output(CLEAN_OUTPUT.replace("Latency Distribution", "").replace("%", ""))
    with pytest.raises(BenchError):
        wrk.parse_time_ms("fast")


def test_lua_script_posts_the_body_and_counts_status(tmp_path: Path) -> None:
    body = tmp_path / "tiny.bin"
    body.write_bytes(b"\0" * 256)
    script = wrk.write_lua_script(body, tmp_path / "post.lua").read_text()
    assert f"[==[{body.resolve()}]==]" in script
    assert 'wrk.method = "POST"' in script
    assert 'wrk.headers["Content-Type"] = "application/octet-stream"' in script
    assert "function response(status" in script
    assert "status < 200 or status > 299" in script
    plain = wrk.write_lua_script(body, tmp_path / "plain.lua", count_status=False).read_text()
    assert "function response" not in plain
    assert "counted=%d" in plain


def test_command_line(tmp_path: Path) -> None:
    if wrk.shutil.which("wrk") is None:
        pytest.skip("wrk not installed")
    cmd = wrk.wrk_command(
        "http://h/p", tmp_path / "s.lua", concurrency=16, duration_s=20, threads=1, timeout_s=10
    )
    assert cmd[1:] == ["-t1", "-c16", "-d20s", "--latency", "--timeout", "10s", "-s",
                       str(tmp_path / "s.lua"), "http://h/p"]  # fmt: skip
