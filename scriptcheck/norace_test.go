//go:build !race

package scriptcheck

const raceDetector = false
