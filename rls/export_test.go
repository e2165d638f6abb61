package rls

import "time"

// SetHTTPReadTimeout sets the bound of reading an HTTP request for the servers made after
// it, so that a test sees a slow client cut without waiting ten seconds.
func SetHTTPReadTimeout(d time.Duration) { httpReadTimeout = d }
