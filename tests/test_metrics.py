from duplex_server.metrics import Histogram, histogram_quantile, parse_histogram


def test_quantiles_interpolate_within_buckets():
    hist = Histogram("h", "test", buckets=(1.0, 2.0, 4.0))
    for value in (0.5, 1.5, 1.5, 3.0):
        hist.observe(value)
    buckets = parse_histogram("\n".join(hist.render()), "h")
    assert buckets == [(1.0, 1), (2.0, 3), (4.0, 4), (float("inf"), 4)]
    assert histogram_quantile(buckets, 0.5) == 1.5
    assert histogram_quantile(buckets, 1.0) == 4.0
    assert histogram_quantile([(1.0, 0), (float("inf"), 0)], 0.5) is None
