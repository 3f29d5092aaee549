//! The decision of `wait`, as a pure state machine: it is told the time (a [`Duration`] since
//! t0, the start of the hook) and the operator's answers, and says what to do next: ask, pause,
//! or stop with a [`Decision`]. No I/O here; [`run`] drives it with an injected [`Clock`] and
//! [`Transport`], so the unit tests below run it on a virtual clock.
//!
//! The rules (the crate's README has them too):
//! - `fallback` = min(the operator's current sleep for the policy, the deadline D).
//! - `Removed`: wait the answer's margin more (clamped to 0..=3600 s, never past the deadline).
//! - `LastEndpoint`: stop at once (waiting changes nothing for the pod's Services).
//! - `Waiting`: ask again; after an answer that came back in under 0.2 s, pause 0.25 s first.
//! - `NotLeader`: ask again at once on a new connection, up to 8 times in a row; the 9th in a
//!   row is a doubt.
//! - Anything else is a doubt: stop asking and wait until t0 + fallback (`Fallback`).
//! - The deadline reached while still waiting (an answer at or after it, or a request cut by
//!   it): `Deadline`.

use std::time::Duration;

/// NotLeader answers in a row that are still asked again; one more is a doubt.
pub const MAX_NOT_LEADER_IN_A_ROW: u32 = 8;
/// The margin of a `Removed` answer is clamped to 0..=this: the CRD's bound on `extraSeconds`,
/// which the operator adds to it (paths the observer does not see, such as an ingress or a
/// cloud load balancer, can need tens of seconds); the deadline bounds it anyway.
pub const MAX_MARGIN: Duration = Duration::from_secs(3600);
/// An answer quicker than this is followed by [`SPIN_PAUSE`] before the next question.
pub const QUICK_ANSWER: Duration = Duration::from_millis(200);
/// The pause after a quick `Waiting`, so that a broken server cannot make the hook spin.
pub const SPIN_PAUSE: Duration = Duration::from_millis(250);
/// Added to the long poll's timeoutSeconds for the whole request's timeout.
pub const REQUEST_SLACK: Duration = Duration::from_secs(2);

/// What `wait` knows before it asks anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The sleep to fall back to, from t0: min(current sleep, deadline).
    pub fallback: Duration,
    /// The end of any wait, from t0 (D).
    pub deadline: Duration,
    /// The longest long poll (T, whole seconds, at least 1).
    pub poll_seconds: u64,
}

impl Plan {
    /// `current_seconds`: the policy's sleep now (the file's value, else N); `deadline_seconds`: D.
    pub fn new(current_seconds: u64, deadline_seconds: u64, poll_seconds: u64) -> Plan {
        Plan {
            fallback: Duration::from_secs(current_seconds.min(deadline_seconds)),
            deadline: Duration::from_secs(deadline_seconds),
            poll_seconds: poll_seconds.max(1),
        }
    }
}

/// An answer of the operator that parsed (a 200 with a JSON body that has a state).
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    Removed {
        margin_seconds: Option<f64>,
    },
    LastEndpoint,
    Waiting,
    NotLeader,
    /// `Unknown` or a state this program does not know: a doubt.
    Other {
        state: String,
        detail: Option<String>,
    },
}

/// A question that got no answer to act on: a doubt, except a [`Failure::timed_out`] of a
/// request that the deadline cut short.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The request's timeout fired (connect, read or whole-request).
    pub timed_out: bool,
    /// Short, for the report and the log line.
    pub reason: String,
}

impl Failure {
    pub fn new(reason: impl Into<String>) -> Failure {
        Failure { timed_out: false, reason: reason.into() }
    }
    pub fn timeout(reason: impl Into<String>) -> Failure {
        Failure { timed_out: true, reason: reason.into() }
    }
}

/// One question to the operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ask {
    /// The `timeoutSeconds` query parameter: how long the server may hold the request.
    pub timeout_seconds: u64,
    /// The whole request's timeout: timeoutSeconds + 2 s, but never past the deadline.
    pub request_timeout: Duration,
    /// Ask on a new connection (after NotLeader: so the Service picks a replica again).
    pub new_connection: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Removed,
    LastEndpoint,
    Deadline,
    Fallback,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Removed => "Removed",
            Outcome::LastEndpoint => "LastEndpoint",
            Outcome::Deadline => "Deadline",
            Outcome::Fallback => "Fallback",
        }
    }
}

/// The end of the asking: what came out, and until when (from t0) the hook still waits.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub outcome: Outcome,
    /// The planned end of the wait, from t0.
    pub end: Duration,
    /// Why, for `Fallback`.
    pub reason: Option<String>,
}

/// What the driver does next.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    Ask(Ask),
    Pause(Duration),
    Done(Decision),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Start,
    /// A question is out since `since`; `cut_by_deadline`: its request timeout ends at the deadline.
    Asking {
        since: Duration,
        cut_by_deadline: bool,
        not_leader: u32,
    },
    Pausing,
    Done,
}

/// The state machine. Feed it [`Machine::start`], then [`Machine::answered`] after each
/// [`Step::Ask`] and [`Machine::paused`] after each [`Step::Pause`], until [`Step::Done`].
/// Out-of-order calls end in a `Fallback` (a doubt), never in a panic.
#[derive(Debug)]
pub struct Machine {
    plan: Plan,
    state: State,
}

impl Machine {
    pub fn new(plan: Plan) -> Machine {
        Machine { plan, state: State::Start }
    }

    /// `ready`: the token and CA could be read (else the reason: a doubt before any question).
    pub fn start(&mut self, now: Duration, ready: Result<(), String>) -> Step {
        if self.state != State::Start {
            return self.doubt(now, "internal: started twice".into());
        }
        match ready {
            Ok(()) => self.ask(now, 0, false),
            Err(reason) => self.doubt(now, reason),
        }
    }

    /// The answer to the last [`Step::Ask`], received at `now`.
    pub fn answered(&mut self, now: Duration, reply: Result<Answer, Failure>) -> Step {
        let State::Asking { since, cut_by_deadline, not_leader } = self.state else {
            return self.doubt(now, "internal: an answer without a question".into());
        };
        match reply {
            Ok(Answer::Removed { margin_seconds }) => {
                let margin = clamp_margin(margin_seconds);
                let end = (now + margin).min(self.plan.deadline.max(now));
                self.done(Outcome::Removed, end, None)
            }
            Ok(Answer::LastEndpoint) => self.done(Outcome::LastEndpoint, now, None),
            Ok(Answer::Waiting) => {
                if now >= self.plan.deadline {
                    return self.done(Outcome::Deadline, now, None);
                }
                if now.saturating_sub(since) < QUICK_ANSWER {
                    self.state = State::Pausing;
                    return Step::Pause(SPIN_PAUSE.min(self.plan.deadline - now));
                }
                self.ask(now, 0, false)
            }
            Ok(Answer::NotLeader) => {
                let in_a_row = not_leader + 1;
                if in_a_row > MAX_NOT_LEADER_IN_A_ROW {
                    return self.doubt(now, format!("NotLeader {in_a_row} times in a row"));
                }
                self.ask(now, in_a_row, true)
            }
            Ok(Answer::Other { state, detail }) => {
                let reason = match detail {
                    Some(d) if !d.is_empty() => format!("state {state}: {d}"),
                    _ => format!("state {state}"),
                };
                self.doubt(now, reason)
            }
            Err(failure) if failure.timed_out && cut_by_deadline && now >= self.plan.deadline => self.done(Outcome::Deadline, now, None),
            Err(failure) => self.doubt(now, failure.reason),
        }
    }

    /// The last [`Step::Pause`] is over at `now`.
    pub fn paused(&mut self, now: Duration) -> Step {
        if self.state != State::Pausing {
            return self.doubt(now, "internal: a pause that was not asked for".into());
        }
        self.ask(now, 0, false)
    }

    /// The next question at `now`, or `Deadline` when none is left.
    fn ask(&mut self, now: Duration, not_leader: u32, new_connection: bool) -> Step {
        let Some(left) = self.plan.deadline.checked_sub(now).filter(|l| !l.is_zero()) else {
            return self.done(Outcome::Deadline, now, None);
        };
        // min(T, seconds left, at least 1), the seconds left rounded up: the deadline cuts the
        // request (request_timeout below), so the server may hold it up to the deadline.
        let left_seconds = left.as_secs() + u64::from(left.subsec_nanos() > 0);
        let timeout_seconds = self.plan.poll_seconds.min(left_seconds).max(1);
        let full = Duration::from_secs(timeout_seconds) + REQUEST_SLACK;
        let cut_by_deadline = left < full;
        self.state = State::Asking { since: now, cut_by_deadline, not_leader };
        Step::Ask(Ask { timeout_seconds, request_timeout: full.min(left), new_connection })
    }

    /// A doubt: the fallback for good, from t0 (nothing more if it has passed).
    fn doubt(&mut self, now: Duration, reason: String) -> Step {
        let end = self.plan.fallback.max(now);
        self.done(Outcome::Fallback, end, Some(short(&reason)))
    }

    fn done(&mut self, outcome: Outcome, end: Duration, reason: Option<String>) -> Step {
        self.state = State::Done;
        Step::Done(Decision { outcome, end, reason })
    }
}

/// min(max(margin, 0), [`MAX_MARGIN`]); no margin, or not a finite number: 0.
fn clamp_margin(margin_seconds: Option<f64>) -> Duration {
    match margin_seconds {
        Some(m) if m.is_finite() && m > 0.0 => Duration::from_secs_f64(m.min(MAX_MARGIN.as_secs_f64())),
        _ => Duration::ZERO,
    }
}

/// A reason cut to 200 characters (on a character boundary), control characters as spaces.
pub fn short(reason: &str) -> String {
    let mut out: String = reason.chars().take(200).map(|c| if c.is_control() { ' ' } else { c }).collect();
    if reason.chars().nth(200).is_some() {
        out.push_str("...");
    }
    out
}

/// The time since t0, and sleeping.
/// What the tests of the state machine and of the HTTP layer share.
#[cfg(test)]
pub(crate) mod testing {
    use super::Clock;
    use std::cell::Cell;
    use std::time::Duration;

    /// A virtual clock: sleeping (and, in the machine's tests, answering) advances it.
    pub(crate) struct FakeClock(pub(crate) Cell<Duration>);
    impl Clock for FakeClock {
        fn now(&self) -> Duration {
            self.0.get()
        }
        fn sleep(&self, d: Duration) {
            self.0.set(self.0.get() + d);
        }
    }
}

pub trait Clock {
    fn now(&self) -> Duration;
    fn sleep(&self, d: Duration);
}

/// Asks the operator.
pub trait Transport {
    fn ask(&mut self, ask: &Ask) -> Result<Answer, Failure>;
}

/// Runs the machine until it decides: asks through `transport`, pauses on `clock`.
pub fn decide<C: Clock, T: Transport>(plan: Plan, ready: Result<(), String>, clock: &C, transport: &mut T) -> Decision {
    let mut machine = Machine::new(plan);
    let mut step = machine.start(clock.now(), ready);
    loop {
        step = match step {
            Step::Ask(ask) => {
                let reply = transport.ask(&ask);
                machine.answered(clock.now(), reply)
            }
            Step::Pause(d) => {
                clock.sleep(d);
                machine.paused(clock.now())
            }
            Step::Done(decision) => return decision,
        };
    }
}

/// Sleeps until `end` (from t0); nothing when it has passed.
pub fn sleep_until<C: Clock>(clock: &C, end: Duration) {
    loop {
        let now = clock.now();
        if now >= end {
            return;
        }
        clock.sleep(end - now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};
    use std::collections::VecDeque;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }
    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    pub(crate) use super::testing::FakeClock;

    /// Scripted answers, each taking some time (capped at the request's timeout, after which
    /// it is a timeout, as a real transport's); records the questions and when they were asked.
    struct Script<'a> {
        clock: &'a FakeClock,
        replies: VecDeque<(Duration, Result<Answer, Failure>)>,
        asked: RefCell<Vec<(Duration, Ask)>>,
    }
    impl<'a> Script<'a> {
        fn new(clock: &'a FakeClock, replies: Vec<(Duration, Result<Answer, Failure>)>) -> Self {
            Script { clock, replies: replies.into(), asked: RefCell::new(Vec::new()) }
        }
    }
    impl Transport for Script<'_> {
        fn ask(&mut self, ask: &Ask) -> Result<Answer, Failure> {
            self.asked.borrow_mut().push((self.clock.now(), *ask));
            let (took, reply) = self.replies.pop_front().expect("the machine asked more than the script has");
            if took >= ask.request_timeout {
                self.clock.sleep(ask.request_timeout);
                return Err(Failure::timeout("timed out"));
            }
            self.clock.sleep(took);
            reply
        }
    }

    fn run(plan: Plan, replies: Vec<(Duration, Result<Answer, Failure>)>) -> (Decision, Vec<(Duration, Ask)>) {
        let clock = FakeClock(Cell::new(Duration::ZERO));
        let mut script = Script::new(&clock, replies);
        let decision = decide(plan, Ok(()), &clock, &mut script);
        assert!(script.replies.is_empty(), "unused answers: {:?}", script.replies);
        (decision, script.asked.into_inner())
    }

    fn removed(margin: f64) -> Result<Answer, Failure> {
        Ok(Answer::Removed { margin_seconds: Some(margin) })
    }
    fn fallback(end: Duration, reason: &str) -> Decision {
        Decision { outcome: Outcome::Fallback, end, reason: Some(reason.into()) }
    }
    fn decision(outcome: Outcome, end: Duration) -> Decision {
        Decision { outcome, end, reason: None }
    }

    #[test]
    fn plan_fallback_is_the_smaller_of_current_and_deadline() {
        assert_eq!(Plan::new(5, 30, 10), Plan { fallback: s(5), deadline: s(30), poll_seconds: 10 });
        assert_eq!(Plan::new(40, 30, 10).fallback, s(30));
        assert_eq!(Plan::new(0, 30, 0), Plan { fallback: s(0), deadline: s(30), poll_seconds: 1 });
    }

    #[test]
    fn removed_waits_the_margin() {
        let (d, asked) = run(Plan::new(20, 60, 10), vec![(s(3), removed(1.5))]);
        assert_eq!(d, decision(Outcome::Removed, ms(4500)));
        assert_eq!(asked, vec![(s(0), Ask { timeout_seconds: 10, request_timeout: s(12), new_connection: false })]);
    }

    #[test]
    fn removed_without_margin_ends_at_once() {
        let (d, _) = run(Plan::new(20, 60, 10), vec![(s(2), Ok(Answer::Removed { margin_seconds: None }))]);
        assert_eq!(d, decision(Outcome::Removed, s(2)));
    }

    #[test]
    fn margin_is_clamped_to_zero_and_to_the_deadline() {
        assert_eq!(run(Plan::new(20, 60, 10), vec![(s(1), removed(-3.0))]).0, decision(Outcome::Removed, s(1)));
        // an extraSeconds of 30 s is waited in full
        assert_eq!(run(Plan::new(20, 60, 10), vec![(s(1), removed(30.25))]).0, decision(Outcome::Removed, ms(31_250)));
        assert_eq!(run(Plan::new(20, 60, 10), vec![(s(1), removed(99.0))]).0, decision(Outcome::Removed, s(60)));
        assert_eq!(run(Plan::new(20, 60, 10), vec![(s(1), removed(f64::NAN))]).0, decision(Outcome::Removed, s(1)));
        assert_eq!(run(Plan::new(20, 60, 10), vec![(s(1), removed(f64::INFINITY))]).0, decision(Outcome::Removed, s(1)));
        // 8 s + 5 s would pass the deadline of 10 s
        assert_eq!(run(Plan::new(20, 10, 10), vec![(s(8), removed(5.0))]).0, decision(Outcome::Removed, s(10)));
    }

    #[test]
    fn last_endpoint_returns_at_once() {
        let (d, asked) = run(Plan::new(20, 60, 10), vec![(ms(40), Ok(Answer::LastEndpoint))]);
        assert_eq!(d, decision(Outcome::LastEndpoint, ms(40)));
        assert_eq!(asked.len(), 1);
    }

    #[test]
    fn waiting_asks_again_and_quick_answers_are_paced() {
        let (d, asked) = run(Plan::new(20, 60, 10), vec![(s(10), Ok(Answer::Waiting)), (ms(50), Ok(Answer::Waiting)), (s(1), removed(0.0))]);
        // 10 s, then 0.05 s (quick: 0.25 s pause), then 1 s
        assert_eq!(d, decision(Outcome::Removed, ms(11_300)));
        let at: Vec<Duration> = asked.iter().map(|(t, _)| *t).collect();
        assert_eq!(at, vec![s(0), s(10), ms(10_300)]);
        assert!(asked.iter().all(|(_, a)| !a.new_connection && a.timeout_seconds == 10));
    }

    #[test]
    fn an_answer_just_over_the_quick_threshold_is_not_paced() {
        let (_, asked) = run(Plan::new(20, 60, 10), vec![(ms(200), Ok(Answer::Waiting)), (s(1), removed(0.0))]);
        assert_eq!(asked[1].0, ms(200));
    }

    #[test]
    fn not_leader_eight_times_then_waiting_then_removed() {
        let mut replies: Vec<_> = (0..8).map(|_| (ms(10), Ok(Answer::NotLeader))).collect();
        replies.push((s(2), Ok(Answer::Waiting)));
        replies.push((s(1), removed(0.5)));
        let (d, asked) = run(Plan::new(20, 60, 10), replies);
        assert_eq!(d, decision(Outcome::Removed, ms(3_580)));
        let new_conn: Vec<bool> = asked.iter().map(|(_, a)| a.new_connection).collect();
        // the first on the agent's (new) connection, 8 new ones after NotLeader, then reuse
        assert_eq!(new_conn, vec![false, true, true, true, true, true, true, true, true, false]);
        // NotLeader is asked again at once: no pause
        assert_eq!(asked[8].0, ms(80));
    }

    #[test]
    fn not_leader_counts_only_in_a_row() {
        let mut replies: Vec<_> = (0..8).map(|_| (ms(10), Ok(Answer::NotLeader))).collect();
        replies.push((s(1), Ok(Answer::Waiting)));
        replies.extend((0..8).map(|_| (ms(10), Ok(Answer::NotLeader))));
        replies.push((s(1), Ok(Answer::LastEndpoint)));
        let (d, asked) = run(Plan::new(20, 60, 10), replies);
        assert_eq!(d.outcome, Outcome::LastEndpoint);
        assert_eq!(asked.len(), 18);
    }

    #[test]
    fn not_leader_nine_times_in_a_row_is_a_doubt() {
        let replies: Vec<_> = (0..9).map(|_| (ms(10), Ok(Answer::NotLeader))).collect();
        let (d, asked) = run(Plan::new(20, 60, 10), replies);
        assert_eq!(d, fallback(s(20), "NotLeader 9 times in a row"));
        assert_eq!(asked.len(), 9);
    }

    #[test]
    fn waiting_until_the_deadline() {
        // D = 25, T = 10: asks of 10, 10, then 5 s (the seconds left); the server answers
        // Waiting each time it holds the request for timeoutSeconds.
        let replies = vec![(s(10), Ok(Answer::Waiting)), (s(10), Ok(Answer::Waiting)), (s(5), Ok(Answer::Waiting))];
        let (d, asked) = run(Plan::new(30, 25, 10), replies);
        assert_eq!(d, decision(Outcome::Deadline, s(25)));
        let polls: Vec<(u64, Duration)> = asked.iter().map(|(_, a)| (a.timeout_seconds, a.request_timeout)).collect();
        assert_eq!(polls, vec![(10, s(12)), (10, s(12)), (5, s(5))]);
    }

    #[test]
    fn a_request_cut_by_the_deadline_is_deadline_not_fallback() {
        // 2.5 s left: timeoutSeconds 3 (rounded up), cut at the deadline; the server holds it
        let replies = vec![(ms(7_500), Ok(Answer::Waiting)), (s(3), Ok(Answer::Waiting))];
        let (d, asked) = run(Plan::new(4, 10, 10), replies);
        assert_eq!(d, decision(Outcome::Deadline, s(10)));
        assert_eq!(asked[1].1, Ask { timeout_seconds: 3, request_timeout: ms(2_500), new_connection: false });
    }

    #[test]
    fn a_timeout_before_the_deadline_is_a_doubt() {
        // the server holds past timeoutSeconds + 2 s
        let (d, _) = run(Plan::new(5, 60, 10), vec![(s(13), Ok(Answer::Waiting))]);
        assert_eq!(d, fallback(s(12), "timed out"));
    }

    #[test]
    fn quick_waiting_near_the_deadline_pauses_only_until_it() {
        // 9.9 s (not quick); 0.1 s left: ask for 1 s, cut at the deadline, which the server passes
        let (d, asked) = run(Plan::new(4, 10, 10), vec![(ms(9_900), Ok(Answer::Waiting)), (s(1), Ok(Answer::Waiting))]);
        assert_eq!(d, decision(Outcome::Deadline, s(10)));
        assert_eq!(asked[1], (ms(9_900), Ask { timeout_seconds: 1, request_timeout: ms(100), new_connection: false }));
        // 0.9 s, then 0.05 s (quick): the pause is cut to the 0.05 s left; then no question
        let (d, asked) = run(Plan::new(4, 1, 10), vec![(ms(900), Ok(Answer::Waiting)), (ms(50), Ok(Answer::Waiting))]);
        assert_eq!(d, decision(Outcome::Deadline, s(1)));
        assert_eq!(asked.len(), 2);
        assert_eq!(asked[1], (ms(900), Ask { timeout_seconds: 1, request_timeout: ms(100), new_connection: false }));
    }

    #[test]
    fn unknown_and_unexpected_states_are_doubts() {
        let unknown = Ok(Answer::Other { state: "Unknown".into(), detail: Some("no agent on node-b".into()) });
        assert_eq!(run(Plan::new(5, 60, 10), vec![(s(1), unknown)]).0, fallback(s(5), "state Unknown: no agent on node-b"));
        let odd = Ok(Answer::Other { state: "Sideways".into(), detail: None });
        assert_eq!(run(Plan::new(5, 60, 10), vec![(s(1), odd)]).0, fallback(s(5), "state Sideways"));
    }

    #[test]
    fn transport_failures_are_doubts() {
        let (d, _) = run(Plan::new(5, 60, 10), vec![(ms(1), Err(Failure::new("HTTP status 500")))]);
        assert_eq!(d, fallback(s(5), "HTTP status 500"));
    }

    #[test]
    fn a_doubt_after_waiting_ends_at_the_fallback_from_t0() {
        let (d, asked) = run(Plan::new(15, 60, 10), vec![(s(10), Ok(Answer::Waiting)), (s(1), Err(Failure::new("connection refused")))]);
        assert_eq!(d, fallback(s(15), "connection refused"));
        assert_eq!(asked.len(), 2);
    }

    #[test]
    fn fallback_already_passed_ends_at_once() {
        let (d, _) = run(Plan::new(5, 60, 10), vec![(s(10), Ok(Answer::Waiting)), (s(3), Err(Failure::new("reset")))]);
        assert_eq!(d, fallback(s(13), "reset"));
    }

    #[test]
    fn fallback_larger_than_the_deadline_is_the_deadline() {
        let (d, _) = run(Plan::new(120, 30, 10), vec![(ms(5), Err(Failure::new("refused")))]);
        assert_eq!(d, fallback(s(30), "refused"));
    }

    #[test]
    fn fallback_from_the_file_or_from_n() {
        // main reads the file: its value, when valid, is the current sleep; else N
        let from_file = Plan::new(7, 60, 10);
        let from_n = Plan::new(12, 60, 10);
        assert_eq!(run(from_file, vec![(ms(5), Err(Failure::new("x")))]).0.end, s(7));
        assert_eq!(run(from_n, vec![(ms(5), Err(Failure::new("x")))]).0.end, s(12));
    }

    #[test]
    fn not_ready_is_a_doubt_without_a_question() {
        let clock = FakeClock(Cell::new(Duration::ZERO));
        let mut script = Script::new(&clock, vec![]);
        let d = decide(Plan::new(9, 60, 10), Err("token: missing".into()), &clock, &mut script);
        assert_eq!(d, fallback(s(9), "token: missing"));
        assert!(script.asked.borrow().is_empty());
    }

    #[test]
    fn zero_fallback_is_kept_when_the_operator_says_zero() {
        let (d, _) = run(Plan::new(0, 60, 10), vec![(ms(30), Err(Failure::new("x")))]);
        assert_eq!(d, fallback(ms(30), "x"));
    }

    #[test]
    fn out_of_order_calls_are_doubts_not_panics() {
        let mut m = Machine::new(Plan::new(5, 60, 10));
        assert_eq!(m.answered(s(1), Ok(Answer::Waiting)), Step::Done(fallback(s(5), "internal: an answer without a question")));
        let mut m = Machine::new(Plan::new(5, 60, 10));
        assert!(matches!(m.start(s(0), Ok(())), Step::Ask(_)));
        assert_eq!(m.paused(s(1)), Step::Done(fallback(s(5), "internal: a pause that was not asked for")));
    }

    #[test]
    fn poll_seconds_and_the_seconds_left() {
        let (_, asked) = run(Plan::new(5, 4, 3), vec![(s(3), Ok(Answer::Waiting)), (ms(500), Ok(Answer::LastEndpoint))]);
        // T = 3 first; then 1 s left: 1
        assert_eq!(asked[0].1, Ask { timeout_seconds: 3, request_timeout: s(4), new_connection: false });
        assert_eq!(asked[1].1, Ask { timeout_seconds: 1, request_timeout: s(1), new_connection: false });
    }

    #[test]
    fn sleep_until_sleeps_the_rest_only() {
        let clock = FakeClock(Cell::new(s(3)));
        sleep_until(&clock, s(5));
        assert_eq!(clock.now(), s(5));
        sleep_until(&clock, s(4));
        assert_eq!(clock.now(), s(5));
    }

    #[test]
    fn short_reasons() {
        assert_eq!(short("a\nb"), "a b");
        let long = "é".repeat(300);
        let cut = short(&long);
        assert_eq!(cut.chars().count(), 203);
        assert!(cut.ends_with("..."));
    }
}
