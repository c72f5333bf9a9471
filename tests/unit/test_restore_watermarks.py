"""The bulk restore waits out a new topic's or a leader election's "not leader" answers (a CI
run saw one right after the topic was created) and gives up on anything else."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from streams.restore import _watermarks


class Answers:
    """get_watermark_offsets raising the given errors first, then answering."""

    def __init__(self, *errors: int) -> None:
        self.errors = list(errors)
        self.calls = 0

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        self.calls += 1
        if self.errors:
            raise KafkaException(KafkaError(self.errors.pop(0)))
        return 3, 9


def test_not_leader_is_retried() -> None:
    answers = Answers(KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE)
    assert _watermarks(answers, TopicPartition("t", 0)) == (3, 9)  # type: ignore[arg-type]
    assert answers.calls == 3


def test_other_errors_and_the_deadline_end_the_wait() -> None:
    with pytest.raises(KafkaException):
        _watermarks(Answers(KafkaError.TOPIC_AUTHORIZATION_FAILED),  # type: ignore[arg-type]
                    TopicPartition("t", 0))
    endless = Answers(*[KafkaError.NOT_LEADER_FOR_PARTITION] * 100)
    with pytest.raises(KafkaException):
        _watermarks(endless, TopicPartition("t", 0), deadline_s=0.3)  # type: ignore[arg-type]
    assert 1 < endless.calls < 100
