// checkin-main: the main thread launches worker threads that check in, hands them work and
// prints the round trips. The logic lives in the CheckinExample target; see README.md.

import CheckinExample

CheckinMainCommand.main()
