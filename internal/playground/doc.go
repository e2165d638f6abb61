// Package playground serves the page of rlfn playground: six cards, one per limiter, whose
// buttons call the deployed ratelimit library through the Go client, as a service would, on
// keys of the playground's own (under Prefix), and draw every decision on a timeline.
package playground
