"""The runtime: a restarting process supervisor and its fork server, for any command.

`supervisor.Supervisor` starts named children, restarts the ones that exit, retires and stops
them; `warm.py` forks them from a server that has imported the command's code once, with
`warm_server.py` the first module that server imports. What a child runs is a parameter, a
`command.Command`; this part imports nothing else of streamtrain (tests/unit/test_layers.py),
and `streamtrain.local` gives it the `streamtrain` command.

Nothing is imported here: the fork server imports `warm_server` before anything else, this
package's `__init__` included.
"""
