module warmwatch.local/loadtest/fanoutwatch

go 1.26.0

require golang.org/x/sys v0.47.0
