"""The provider's reference checks, wire parsing and tenant keys, in this process (no service, no torch)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mccl.control.auth import new_secret
from mccl.provider.errors import BadReference, BadRequest, ProviderError, QuotaExceeded
from mccl.provider.keys import read_credential, tenant_credential, write_credential
from mccl.provider.memory import MAX_INT, Ref, Registry, map_segment
from mccl.provider.protocol import decode, encode, hosts_field


@pytest.fixture
def registry():
    registry = Registry(max_bytes=1 << 16, max_allocations=4)
    yield registry
    registry.release_all(set(range(1, 100)))


def test_a_reference_inside_the_own_allocation_resolves(registry):
    segment = registry.allocate("alice", 4096)
    found, ref = registry.resolve("alice", [segment.alloc_id, 1024, 3072], 4)
    assert found is segment and ref == Ref(segment.alloc_id, 1024, 3072)
    assert registry.resolve("alice", [segment.alloc_id, 4096, 0])[1].length == 0  # empty, at the very end


@pytest.mark.parametrize(("make_ref", "words"), [
    (lambda a: [a, 4096, 1], "outside allocation"),  # starts at the end
    (lambda a: [a, 4000, 97], "outside allocation"),  # ends one byte past it
    (lambda a: [a, 0, 4097], "outside allocation"),
    (lambda a: [a, MAX_INT, MAX_INT], "outside allocation"),  # would overflow an int64 sum
    (lambda a: [a, 8, MAX_INT - 4], "outside allocation"),
    (lambda a: [a, 2**64, 4], "outside 0..2^63-1"),
    (lambda a: [a, -4, 8], "outside 0..2^63-1"),
    (lambda a: [a, 0, -1], "outside 0..2^63-1"),
    (lambda a: [a + 1000, 0, 4], "not an allocation of tenant 'alice'"),  # unknown id
    (lambda a: [-1, 0, 4], "outside 0..2^63-1"),
    (lambda a: [a, 2, 4], "multiples of the element size 4"),
    (lambda a: [a, 0, 6], "multiples of the element size 4"),
    (lambda a: [a, 0.0, 4], "must be an integer"),
    (lambda a: [a, True, 4], "must be an integer"),
    (lambda a: [str(a), 0, 4], "must be an integer"),
    (lambda a: [a, 0], "expected [allocation id, offset, length]"),
    (lambda a: {"alloc": a}, "expected [allocation id, offset, length]"),
    (lambda a: None, "expected [allocation id, offset, length]"),
])
def test_every_bad_reference_is_refused_with_its_reason(registry, make_ref, words):
    segment = registry.allocate("alice", 4096)
    with pytest.raises(BadReference, match=None) as caught:
        registry.resolve("alice", make_ref(segment.alloc_id), 4)
    assert words in str(caught.value)


def test_another_tenants_allocation_looks_unknown_and_is_counted(registry):
    theirs = registry.allocate("bob", 4096)
    with pytest.raises(BadReference) as foreign:
        registry.resolve("alice", [theirs.alloc_id, 0, 4])
    with pytest.raises(BadReference) as unknown:
        registry.resolve("alice", [theirs.alloc_id + 1, 0, 4])
    assert str(foreign.value).replace(str(theirs.alloc_id), "N") == str(unknown.value).replace(
        str(theirs.alloc_id + 1), "N")  # no way to probe for others' ids
    assert registry.foreign == 1
    with pytest.raises(BadReference):
        registry.release("alice", theirs.alloc_id)
    assert registry.resolve("bob", [theirs.alloc_id, 0, 4096])[0] is theirs  # still there


@given(offset=st.integers(-2**65, 2**65), length=st.integers(-2**65, 2**65))
def test_a_resolved_reference_is_always_inside_the_allocation(offset, length):
    registry = Registry()
    segment = registry.allocate("alice", 1000)
    try:
        _, ref = registry.resolve("alice", [segment.alloc_id, offset, length])
        assert ref.offset >= 0 and ref.length >= 0 and ref.offset + ref.length <= 1000
    except BadReference:
        assert not (offset >= 0 and length >= 0 and offset + length <= 1000)
    finally:
        registry.release_all({segment.alloc_id})


def test_quotas_and_ids_are_never_reused(registry):
    with pytest.raises(QuotaExceeded):
        registry.allocate("alice", 0)
    with pytest.raises(QuotaExceeded):
        registry.allocate("alice", (1 << 16) + 1)
    with pytest.raises(QuotaExceeded):
        registry.allocate("alice", True)
    first = registry.allocate("alice", 1 << 15)
    registry.allocate("alice", 1 << 15)
    with pytest.raises(QuotaExceeded, match="quota"):
        registry.allocate("alice", 1)
    registry.allocate("bob", 1 << 15)  # another tenant's quota is its own
    registry.release("alice", first.alloc_id)
    again = registry.allocate("alice", 16)
    assert again.alloc_id > first.alloc_id
    with pytest.raises(BadReference):
        registry.resolve("alice", [first.alloc_id, 0, 1])


def test_a_segment_is_sealed_and_nameless_once_the_tenant_mapped_it(registry):
    segment = registry.allocate("alice", 4096)
    descriptor = os.open(segment.path, os.O_RDWR)  # the tenant's side: it could try to shrink the file
    with pytest.raises(OSError):
        os.ftruncate(descriptor, 0)  # sealed: the service's mapping can never fault
    with pytest.raises(OSError):
        os.ftruncate(descriptor, 8192)
    os.close(descriptor)
    mapped = map_segment(segment.path, 4096)
    path = segment.path
    segment.unlink()
    mapped[:4] = b"abcd"
    assert segment.buffer[:4] == b"abcd"  # the same memory, reachable by the two mappings only
    mapped.close()
    with pytest.raises(FileNotFoundError):
        map_segment(path, 4096)


@pytest.mark.parametrize("frame", [b"", b"\xff\xfe", b"[]", b"nan", b'{"v":1}', b'{"v":2,"op":"alloc"}',
                                   b'{"v":1,"op":3}', b'{"v":1,"op":"x","id":-1}', b'{"v":1,"op":"x","id":1e400}',
                                   b'{"v":1,"op":"x","id":NaN}', b"[" * 100000, b'{"v":1,"op":"x","id":"1"}',
                                   b" " * (70 << 10)])
def test_garbage_frames_are_bad_requests(frame):
    with pytest.raises(BadRequest):
        decode(frame)


def test_a_request_round_trips_and_hosts_are_checked():
    assert decode(encode({"op": "alloc", "id": 7, "nbytes": 4}))["nbytes"] == 4
    assert hosts_field({"hosts": [1, 0]}, 2) == (1, 0)
    for hosts in ([], [0, 0], [2], [True], "0", [0, 1, 2]):
        with pytest.raises(BadRequest):
            hosts_field({"hosts": hosts}, 2)


def test_each_tenant_has_its_own_key_and_the_file_is_private(tmp_path):
    secret = new_secret()
    alice, bob = tenant_credential(secret, "alice"), tenant_credential(secret, "bob")
    assert alice.public != bob.public and alice.server_public == bob.server_public == secret.server_keys[0]
    assert tenant_credential(secret, "alice") == alice  # every service of the provider derives the same key
    assert tenant_credential(new_secret(), "alice").public != alice.public
    assert "hidden" in repr(alice) and alice.secret.decode() not in repr(alice)
    path = write_credential(tmp_path / "alice.key", alice)
    assert read_credential(path) == alice
    with pytest.raises(ProviderError):
        write_credential(path, alice)  # never over an existing file
    path.chmod(0o644)
    with pytest.raises(ProviderError, match="chmod 600"):
        read_credential(path)
    with pytest.raises(ProviderError):
        tenant_credential(secret, "")
