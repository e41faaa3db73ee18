"""Operations on a running job, as library functions: what `streamtrain checkpoint`, `rollback`,
`resize`, `predict` and `curves` do, callable from Python with an etcd client and endpoints.

- `checkpoints.py`: a job-wide checkpoint (`request_checkpoint`) and the rollback to one;
- `resizing.py`: moving the job to another count of parameter-server shards (`resize`);
- `predict.py`: scoring records with the parameters the shards serve (`Predictor`);
- `curves.py`: the job's training curves for TensorBoard (`write_curves`).

They import the components and nothing of the rest of the top package but each other
(tests/unit/test_layers.py); `LocalJob` and the CLI are built on them. Nothing is imported
here: each module loads what it needs when used.
"""
