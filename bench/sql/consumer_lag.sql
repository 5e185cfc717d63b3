-- What the bridge asks after each round that moved rows (bench/run.sh lagquery).
SELECT envelopes.consumer_lag('lq');
