// checkin-worker: a worker process that finds checkin-main's port by name, checks in with its
// own named port, counts what it is given and exits when told to stop. The logic lives in the
// CheckinExample target; see README.md.

import CheckinExample

CheckinWorkerCommand.main()
