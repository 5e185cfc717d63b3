-- One poll of a consumer that has nothing to read (the bridge's idle poll).
SELECT count(*) FROM envelopes.consumer_envelope_batch('idle', 1000);
