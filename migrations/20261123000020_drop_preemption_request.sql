-- Preemption is decided by the controller from the cluster's state (a booked pod
-- the scheduler cannot place), never on request: the webhook no longer files
-- requests and no one reads them, so that no admission review can end a pod.
DROP TABLE preemption_request;
