package absorb

import "time"

// The values of watchsan_watch_gone_absorbed_total's outcome label (Outcomes), which are also
// why a feed holds no state (Holder.Unable).
const (
	// Absorbed: the subscribers got the difference; no 410 reached them.
	Absorbed = "absorbed"
	// NotComplete: the feed holds no complete state: its upstream watch began at a client's
	// resourceVersion (not with the initial state), or delivered an object it could not key
	// or compare.
	NotComplete = "not-complete"
	// OverBudget: the state, or the list, would pass --watch-absorb-state-bytes or
	// --watch-absorb-total-bytes; the state was dropped.
	OverBudget = "over-budget"
	// Format: the feed's objects are neither whole objects nor Table rows (metadata only:
	// Accept with "as=PartialObjectMetadata"), or its format is not one absorbing reads
	// (stream.ListCodecForAccept: JSON, protobuf, CBOR, and Tables in JSON are).
	Format = "format"
	// ListFailed: the list did not succeed in time (backed off within the resume timeout),
	// was malformed, or did not agree with the state.
	ListFailed = "list-failed"
	// ListDenied: a subscriber of a shared feed was reviewed for watch, and the apiserver did
	// not say that it may list the scope (the absorb's events are a list's): it got the 410
	// alone.
	ListDenied = "list-denied"
)

// Outcomes lists watchsan_watch_gone_absorbed_total's outcomes (to initialise series).
var Outcomes = []string{Absorbed, NotComplete, OverBudget, Format, ListFailed, ListDenied}

// The values of watchsan_watch_absorb_completing_lists_total's result label (Holder.Complete).
const (
	CompleteDone       = "complete"
	CompleteGone       = "gone"
	CompleteOverBudget = "over-budget"
	CompleteFailed     = "failed"
)

// CompletingListResults lists watchsan_watch_absorb_completing_lists_total's results.
var CompletingListResults = []string{CompleteDone, CompleteGone, CompleteOverBudget, CompleteFailed}

// Defaults of the state's budgets and of parking, the flags' defaults.
const (
	// DefaultStateBytes bounds one feed's state: a namespace's pods or a cluster's nodes fit
	// many times over; a feed over it drops its state.
	DefaultStateBytes = 16 << 20
	// DefaultTotalBytes bounds the states of all feeds together.
	DefaultTotalBytes = 128 << 20
	// DefaultParkTime is how long an ended watch's complete state waits for its client's
	// re-watch: a reflector re-watches at once after a clean end.
	DefaultParkTime = 30 * time.Second
)

// PageSize is the limit of each page of an absorb's list, client-go's reflector's.
const PageSize = 500

// CompleteListTimeout bounds a completing list (Holder.Complete): the client's stream waits
// for it before its first event.
const CompleteListTimeout = 10 * time.Second
