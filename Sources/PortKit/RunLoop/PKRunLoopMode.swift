// Run-loop modes: named sets of sources, timers and observers (CFRunLoopMode).

/// A run-loop mode: the name of a set of input sources, timers and observers.
///
/// A loop running in a mode watches only that mode's items. `default` is the mode of ordinary
/// work (`NSDefaultRunLoopMode`); `common` is the pseudo-mode of `NSRunLoopCommonModes`: an
/// item added to it belongs to every mode in the loop's common set (which holds `default` and
/// whatever `PKRunLoop.addCommonMode(_:)` added). Any other string names a custom mode.
public struct PKRunLoopMode: Hashable, Sendable, ExpressibleByStringLiteral, CustomStringConvertible {
    /// The mode's name.
    public let rawValue: String

    /// A mode with the given name.
    public init(_ rawValue: String) { self.rawValue = rawValue }

    public init(stringLiteral value: String) { self.rawValue = value }

    /// The default mode (`NSDefaultRunLoopMode`, `kCFRunLoopDefaultMode`).
    public static let `default` = PKRunLoopMode("PKDefaultRunLoopMode")

    /// The common-modes pseudo-mode (`NSRunLoopCommonModes`, `kCFRunLoopCommonModes`).
    /// Items can be added to it; a loop cannot run in it.
    public static let common = PKRunLoopMode("PKRunLoopCommonModes")

    public var description: String { rawValue }
}

/// The activities an observer can watch (`CFRunLoopActivity`).
public struct PKRunLoopActivity: OptionSet, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }

    /// The loop is entering a run (`kCFRunLoopEntry`).
    public static let entry = PKRunLoopActivity(rawValue: 1 << 0)
    /// The loop is about to fire timers (`kCFRunLoopBeforeTimers`).
    public static let beforeTimers = PKRunLoopActivity(rawValue: 1 << 1)
    /// The loop is about to handle sources (`kCFRunLoopBeforeSources`).
    public static let beforeSources = PKRunLoopActivity(rawValue: 1 << 2)
    /// The loop is about to sleep (`kCFRunLoopBeforeWaiting`).
    public static let beforeWaiting = PKRunLoopActivity(rawValue: 1 << 5)
    /// The loop has woken, before it handles what woke it (`kCFRunLoopAfterWaiting`).
    public static let afterWaiting = PKRunLoopActivity(rawValue: 1 << 6)
    /// The loop is leaving a run (`kCFRunLoopExit`).
    public static let exit = PKRunLoopActivity(rawValue: 1 << 7)
    /// Every activity (`kCFRunLoopAllActivities`).
    public static let all: PKRunLoopActivity = [.entry, .beforeTimers, .beforeSources, .beforeWaiting, .afterWaiting, .exit]

    public var description: String {
        let names: [(PKRunLoopActivity, String)] = [
            (.entry, "entry"), (.beforeTimers, "beforeTimers"), (.beforeSources, "beforeSources"),
            (.beforeWaiting, "beforeWaiting"), (.afterWaiting, "afterWaiting"), (.exit, "exit"),
        ]
        return names.filter { contains($0.0) }.map(\.1).joined(separator: "|")
    }
}

/// Why a run returned (`CFRunLoopRunResult`).
public enum PKRunLoopRunResult: Sendable, Equatable {
    /// The mode has no sources and no timers (`kCFRunLoopRunFinished`).
    case finished
    /// `PKRunLoop.stop()` ended the run (`kCFRunLoopRunStopped`).
    case stopped
    /// The deadline passed (`kCFRunLoopRunTimedOut`).
    case timedOut
    /// A source was handled and the run was asked to return after one (`kCFRunLoopRunHandledSource`).
    /// Timers never count as sources.
    case handledSource
}
