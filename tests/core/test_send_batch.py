"""A process' batched sends to the broker (apps.core.send_batch): every id added reaches a
send once, in bounded batches; a failed send loses nothing a sweeper cannot find."""

from __future__ import annotations

import os
import threading

from apps.core.send_batch import ProcessBatcher, SendBatcher


def test_ids_added_from_many_threads_are_each_sent_once_in_bounded_batches():
    sent: list[list[str]] = []
    lock = threading.Lock()

    def send(batch: list[str]) -> None:
        with lock:
            sent.append(list(batch))

    batcher = SendBatcher(send=send, seconds=0.01, what="test.many", most=50)
    ids = [f"int_{n}" for n in range(2000)]

    def add(part: list[str]) -> None:
        for item_id in part:
            batcher.add(item_id)

    threads = [threading.Thread(target=add, args=(ids[i::8],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    batcher.flush()
    flat = [i for batch in sent for i in batch]
    assert sorted(flat) == sorted(ids)  # each once
    assert all(1 <= len(batch) <= 50 for batch in sent)
    assert len(sent) < len(ids) / 5  # gathered, not one message per id


def test_a_failed_send_is_logged_and_the_next_batch_still_goes(caplog):
    sent: list[list[str]] = []
    ready = threading.Event()

    def send(batch: list[str]) -> None:
        if batch == ["broken"]:
            raise ConnectionError("broker down")
        sent.append(batch)
        ready.set()

    batcher = SendBatcher(send=send, seconds=0.0, what="test.many", most=1)
    batcher.add("broken")
    batcher.add("fine")
    assert ready.wait(timeout=30)
    assert sent == [["fine"]]
    assert "could not enqueue test.many for 1 ids" in caplog.text


def test_a_forked_child_sends_with_a_batcher_of_its_own():
    # The parent's batcher holds an id its thread has not sent; the child's first add makes a
    # new batcher (and thread), which sends the child's id alone, never the parent's.
    read, write = os.pipe()

    def send(batch: list[str]) -> None:
        os.write(write, (",".join(batch) + "\n").encode())

    per_process = ProcessBatcher(send=send, what="test.fork")
    try:
        parent = per_process.get(seconds=3600)
        parent.add("parent-id")
        pid = os.fork()
        if pid == 0:  # the child: its own batcher, flushed at once
            try:
                child = per_process.get(seconds=3600)
                code = 0 if child is not parent else 1
                child.add("child-id")
                child.flush()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert os.read(read, 1000) == b"child-id\n"
        parent.flush()
        assert os.read(read, 1000) == b"parent-id\n"
    finally:
        per_process.forget()
        os.close(read)
        os.close(write)
