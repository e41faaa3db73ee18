import pickle
import types

from streamtrain import schemas
from streamtrain.schemas import SchemaError


def test_schema_error_is_a_value_error_carrying_format_and_field():
    err = SchemaError("GradientDelta", "sparse[0].values", "NaN not allowed", 1)
    assert isinstance(err, ValueError)
    assert (err.format, err.field, err.reason, err.version) == ("GradientDelta", "sparse[0].values", "NaN not allowed",
                                                                1)


def test_message_names_format_version_and_field():
    err = SchemaError("GradientDelta", "sparse[0].values", "NaN not allowed", 1)
    assert str(err) == "GradientDelta v1: field 'sparse[0].values': NaN not allowed"
    assert str(SchemaError("Job", "job.name", "bad")) == "Job: field 'job.name': bad"


def test_schema_error_survives_pickling_with_its_attributes():
    err = pickle.loads(pickle.dumps(SchemaError("TaskRecord", "end", "must be greater than start", 1)))
    assert (err.format, err.field, err.version, str(err)) == (
        "TaskRecord", "end", 1, "TaskRecord v1: field 'end': must be greater than start",
    )  # fmt: skip


def test_public_surface_is_exactly_all():
    public = {name for name, value in vars(schemas).items()
              if not name.startswith("_") and not isinstance(value, types.ModuleType)}
    assert public == set(schemas.__all__)
