"""The shard's storage: what `PserverShard` makes its checkpoint store from unless given another."""

from __future__ import annotations

from pathlib import Path

from streamtrain.infra import Endpoints
from streamtrain.pserver.shard import PserverShard, ShardOptions
from streamtrain.pserver.storage import ShardStorage
from streamtrain.schemas.config import JobConfig

NOWHERE = Endpoints("localhost:1", "localhost:2", "redis://localhost:3")  # nothing is connected to


def test_the_checkpoint_store_is_the_jobs_uri_and_count_for_that_shard(tmp_path: Path) -> None:
    config = JobConfig.from_toml(f'[job]\nname = "ctr"\n[input]\ntopics = ["clicks"]\n'
                                 f'[pservers]\ncheckpoint_uri = "{tmp_path.as_uri()}"\nkeep_checkpoints = 5\n')
    store = ShardStorage(NOWHERE).checkpoint_store(config, 2)
    assert (store.uri, store.job, store.shard, store.keep) == (tmp_path.as_uri(), "ctr", 2, 5)
    assert store.root == f"{tmp_path}/shard-2"


def test_a_shard_uses_the_storage_it_is_given_and_makes_its_own_otherwise() -> None:
    given = ShardStorage(NOWHERE)
    assert PserverShard(NOWHERE, ShardOptions("ctr"), storage=given).storage is given
    own = PserverShard(NOWHERE, ShardOptions("ctr")).storage
    assert type(own) is ShardStorage and own.endpoints is NOWHERE
