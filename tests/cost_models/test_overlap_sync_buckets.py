"""``sync_buckets``: the buckets SyncStream issues, replayed without times (what Plan.grad_buckets records)."""

from __future__ import annotations

import pytest

from cost_models.overlap import GradBucket, OverlapPolicy, bucket_layers, sync_buckets, sync_schedule


def test_sync_buckets_are_the_streams_and_the_last_is_the_one_the_report_names() -> None:
    nbytes = [10, 10, 10, 30, 5]
    assert sync_buckets([1.0] * 5, nbytes, 25) == bucket_layers(nbytes, 25) == [[0, 1, 2], [3], [4]]
    policy = OverlapPolicy(bucket_bytes=25)
    assert sync_buckets([1.0] * 5, nbytes, 25)[-1] == sync_schedule([1.0] * 5, [1.0] * 5, policy, nbytes)[1]


def test_units_without_a_reduction_join_no_bucket_and_size_zero_is_a_bucket_per_unit() -> None:
    # unit 1 reduces nothing (a unit of ops without parameters): it neither joins nor closes a bucket
    assert sync_buckets([1.0, 0.0, 1.0, 1.0], [10, 0, 20, 5], 25) == [[0, 2], [3]]
    assert sync_buckets([1.0, 0.0, 1.0], [10, 0, 20], 0) == [[0], [2]]
    assert sync_buckets([0.0, 0.0], [0, 0], 25) == []


def test_a_grad_bucket_says_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="must be one of all_reduce, reduce_scatter"):
        GradBucket(0, "send", ("w",), 4, "linear", 0, 25)
    with pytest.raises(ValueError, match="needs members"):
        GradBucket(0, "all_reduce", (), 4, "linear", 0, 25)
