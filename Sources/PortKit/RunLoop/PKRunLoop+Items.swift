// Adding and removing a loop's items (sources, timers, observers) in modes, common modes
// included, and keeping epoll's interest list in step with the running mode.

extension PKRunLoop {
    // MARK: - Common modes

    /// Adds `mode` to the loop's common modes: every item in `.common` joins it
    /// (`CFRunLoopAddCommonMode`). Loop-only.
    public func addCommonMode(_ mode: PKRunLoopMode) {
        assertOwner("addCommonMode(_:)")
        precondition(mode != .common, "PKRunLoop.addCommonMode: .common is not a real mode")
        guard commonModes.insert(mode).inserted else { return }
        for source in commonItems.customSources { insert(source, into: mode) }
        for timer in commonItems.timers { insert(timer, into: mode) }
        for observer in commonItems.observers { insert(observer, into: mode) }
        for token in commonItems.descriptorTokens {
            if let source = descriptorSources[token] { insert(source, into: mode) }
        }
    }

    /// The loop's common modes. Loop-only.
    public var allCommonModes: Set<PKRunLoopMode> {
        assertOwner("allCommonModes")
        return commonModes
    }

    private func resolve(_ mode: PKRunLoopMode) -> [PKRunLoopMode] {
        mode == .common ? Array(commonModes) : [mode]
    }

    // MARK: - Custom sources

    /// Adds a custom source to `mode` (`CFRunLoopAddSource`); its `schedule` routine runs now.
    /// Loop-only. A source belongs to one loop.
    public func add(_ source: PKCustomSource, forMode mode: PKRunLoopMode) {
        assertOwner("add(_:forMode:)")
        guard source.isValid else { return }
        precondition(source.loop == nil || source.loop === self, "PKRunLoop.add: a custom source belongs to one run loop")
        source.loop = self
        if mode == .common, !commonItems.customSources.contains(where: { $0 === source }) {
            commonItems.customSources.append(source)
        }
        for m in resolve(mode) { insert(source, into: m) }
    }

    /// Removes a custom source from `mode`; its `cancel` routine runs now. Loop-only.
    public func remove(_ source: PKCustomSource, forMode mode: PKRunLoopMode) {
        assertOwner("remove(_:forMode:)")
        if mode == .common { commonItems.customSources.removeAll { $0 === source } }
        for m in resolve(mode) {
            guard let index = modeItems[m]?.customSources.firstIndex(where: { $0 === source }) else { continue }
            modeItems[m]!.customSources.remove(at: index)
            source.cancelled(on: self, mode: m)
        }
    }

    /// Whether `mode` contains `source`. Loop-only.
    public func contains(_ source: PKCustomSource, inMode mode: PKRunLoopMode) -> Bool {
        assertOwner("contains(_:inMode:)")
        return modeItems[mode]?.customSources.contains { $0 === source } ?? false
    }

    private func insert(_ source: PKCustomSource, into mode: PKRunLoopMode) {
        var items = modeItems[mode, default: ModeItems()]
        guard !items.customSources.contains(where: { $0 === source }) else { return }
        let index = items.customSources.firstIndex { $0.order > source.order } ?? items.customSources.endIndex
        items.customSources.insert(source, at: index)
        modeItems[mode] = items
        if source.isSignalled { noteSignalled() }
        source.scheduled(on: self, mode: mode)
    }

    // MARK: - Timers

    /// Adds a timer to `mode` (`-[NSRunLoop addTimer:forMode:]`, `CFRunLoopAddTimer`). Loop-only.
    /// A timer belongs to one loop; adding an invalid timer does nothing.
    public func add(_ timer: PKTimer, forMode mode: PKRunLoopMode) {
        assertOwner("add(_:forMode:)")
        guard timer.isValid else { return }
        precondition(timer.loop == nil || timer.loop === self, "PKRunLoop.add: a timer belongs to one run loop")
        timer.loop = self
        if mode == .common, !commonItems.timers.contains(where: { $0 === timer }) {
            commonItems.timers.append(timer)
        }
        for m in resolve(mode) { insert(timer, into: m) }
        if let currentMode { armTimer(for: currentMode) }
    }

    /// Removes a timer from `mode` without invalidating it. Loop-only.
    public func remove(_ timer: PKTimer, forMode mode: PKRunLoopMode) {
        assertOwner("remove(_:forMode:)")
        if mode == .common { commonItems.timers.removeAll { $0 === timer } }
        for m in resolve(mode) { modeItems[m]?.timers.removeAll { $0 === timer } }
    }

    /// Whether `mode` contains `timer`. Loop-only.
    public func contains(_ timer: PKTimer, inMode mode: PKRunLoopMode) -> Bool {
        assertOwner("contains(_:inMode:)")
        return modeItems[mode]?.timers.contains { $0 === timer } ?? false
    }

    /// Makes a timer, adds it to `mode` and returns it
    /// (`+[NSTimer scheduledTimerWithTimeInterval:repeats:block:]`). Loop-only.
    @discardableResult
    public func scheduleTimer(
        after interval: Duration, repeats: Bool = false, tolerance: Duration = .zero,
        forMode mode: PKRunLoopMode = .default, handler: @escaping (PKTimer) -> Void
    ) -> PKTimer {
        let timer = PKTimer(fireDate: .after(interval), interval: repeats ? interval : nil, tolerance: tolerance, handler: handler)
        add(timer, forMode: mode)
        return timer
    }

    private func insert(_ timer: PKTimer, into mode: PKRunLoopMode) {
        var items = modeItems[mode, default: ModeItems()]
        guard !items.timers.contains(where: { $0 === timer }) else { return }
        items.timers.append(timer)
        modeItems[mode] = items
    }

    // MARK: - Observers

    /// Adds an observer to `mode` (`CFRunLoopAddObserver`). Loop-only.
    public func add(_ observer: PKRunLoopObserver, forMode mode: PKRunLoopMode) {
        assertOwner("add(_:forMode:)")
        guard observer.isValid else { return }
        observer.loop = self
        if mode == .common, !commonItems.observers.contains(where: { $0 === observer }) {
            commonItems.observers.append(observer)
        }
        for m in resolve(mode) { insert(observer, into: m) }
    }

    /// Removes an observer from `mode`. Loop-only.
    public func remove(_ observer: PKRunLoopObserver, forMode mode: PKRunLoopMode) {
        assertOwner("remove(_:forMode:)")
        if mode == .common { commonItems.observers.removeAll { $0 === observer } }
        for m in resolve(mode) { modeItems[m]?.observers.removeAll { $0 === observer } }
    }

    private func insert(_ observer: PKRunLoopObserver, into mode: PKRunLoopMode) {
        var items = modeItems[mode, default: ModeItems()]
        guard !items.observers.contains(where: { $0 === observer }) else { return }
        let index = items.observers.firstIndex { $0.order > observer.order } ?? items.observers.endIndex
        items.observers.insert(observer, at: index)
        modeItems[mode] = items
    }

    // MARK: - Descriptor sources

    /// Adds a descriptor source to `mode`. Loop-only. A source belongs to one loop.
    ///
    /// - Throws: `PKError` if epoll refuses the descriptor (for example, a regular file).
    public func add(_ source: PKDescriptorSource, forMode mode: PKRunLoopMode) throws(PKError) {
        assertOwner("add(_:forMode:)")
        precondition(source.isValid, "PKRunLoop.add: the descriptor source was invalidated")
        precondition(source.loop == nil || source.loop === self, "PKRunLoop.add: a descriptor source belongs to one run loop")
        if source.loop == nil {
            source.loop = self
            source.token = nextToken
            nextToken += 1
            descriptorSources[source.token] = source
        }
        if mode == .common { commonItems.descriptorTokens.insert(source.token) }
        for m in resolve(mode) { insert(source, into: m) }
        // Watch it now unless the loop runs a mode the source is not in: a loop that is not
        // running may be hosted through `descriptor`, which must become readable for it, and
        // epoll's refusal is reported here, by this call.
        let watchedNow = currentMode.map { source.modes.contains($0) } ?? true
        if watchedNow, source.registeredEvents == nil {
            do throws(PKError) {
                try register(source)
            } catch {
                removeDescriptorSourceEverywhere(source)
                throw error
            }
        }
        // Not registered (another mode runs, or `events` is empty): the next pass in one of its
        // modes registers it.
        if source.registeredEvents == nil { parkedSources.insert(source.token) }
    }

    /// Removes a descriptor source from `mode` (`CFRunLoopRemoveSource`). Removed from its last
    /// mode, the source stays valid and belongs to this loop: epoll stops watching it until it
    /// is added to a mode again. Only `invalidate()` (or the thread's end) ends it. Loop-only.
    public func remove(_ source: PKDescriptorSource, forMode mode: PKRunLoopMode) {
        assertOwner("remove(_:forMode:)")
        guard source.loop === self else { return }
        if mode == .common { commonItems.descriptorTokens.remove(source.token) }
        for m in resolve(mode) {
            source.modes.remove(m)
            modeItems[m]?.descriptorTokens.remove(source.token)
        }
        if source.modes.isEmpty {
            unregister(source)
            parkedSources.insert(source.token)
        }
    }

    func removeDescriptorSourceEverywhere(_ source: PKDescriptorSource) {
        assertOwner("invalidate()")
        unregister(source)
        for m in source.modes { modeItems[m]?.descriptorTokens.remove(source.token) }
        commonItems.descriptorTokens.remove(source.token)
        source.modes = []
        parkedSources.remove(source.token)
        descriptorSources[source.token] = nil
        source.markInvalid()
    }

    private func insert(_ source: PKDescriptorSource, into mode: PKRunLoopMode) {
        source.modes.insert(mode)
        modeItems[mode, default: ModeItems()].descriptorTokens.insert(source.token)
    }

    func register(_ source: PKDescriptorSource) throws(PKError) {
        guard let mask = source.epollMask else { return }
        if source.registeredEvents == nil {
            try Epoll.add(epollFD, source.descriptor, events: mask, token: source.token)
        } else if source.registeredEvents != mask {
            try Epoll.modify(epollFD, source.descriptor, events: mask, token: source.token)
        }
        source.registeredEvents = mask
    }

    func unregister(_ source: PKDescriptorSource) {
        guard source.registeredEvents != nil else { return }
        Epoll.remove(epollFD, source.descriptor)
        source.registeredEvents = nil
    }

    func descriptorEventsChanged(_ source: PKDescriptorSource) {
        assertOwner("PKDescriptorSource.events")
        guard source.registeredEvents != nil else { return }
        if source.epollMask == nil {
            unregister(source)
            parkedSources.insert(source.token)
        } else {
            do throws(PKError) { try register(source) } catch {
                preconditionFailure("PortKit bug: epoll refused a change of events on a registered descriptor: \(error)")
            }
        }
    }

    func registerParkedSources(for mode: PKRunLoopMode) {
        for token in parkedSources {
            guard let source = descriptorSources[token] else { parkedSources.remove(token); continue }
            guard source.modes.contains(mode), source.epollMask != nil else { continue }
            parkedSources.remove(token)
            do throws(PKError) { try register(source) } catch {
                // It was accepted once; a failure now means the descriptor changed under us.
                removeDescriptorSourceEverywhere(source)
            }
        }
    }

    // MARK: - Emptiness

    /// Drops invalidated sources, timers and observers from `mode`, calling `cancel` routines.
    func purgeInvalid(_ mode: PKRunLoopMode) {
        // Only when something may have been invalidated since this mode's last purge.
        let count = invalidationCount
        guard let purgedAt = modeItems[mode]?.purgedAt, purgedAt != count else { return }
        modeItems[mode]!.purgedAt = count
        var cancelled: [PKCustomSource] = []
        modeItems[mode]!.customSources.removeAll { source in
            if source.isValid { return false }
            cancelled.append(source)
            return true
        }
        modeItems[mode]!.timers.removeAll { !$0.isValid }
        modeItems[mode]!.observers.removeAll { !$0.isValid }
        if !cancelled.isEmpty {
            commonItems.customSources.removeAll { !$0.isValid }
            for source in cancelled { source.cancelled(on: self, mode: mode) }
        }
        commonItems.timers.removeAll { !$0.isValid }
        commonItems.observers.removeAll { !$0.isValid }
    }

    /// Drops `mode`'s entry once nothing is left in it, for a mode that will not run again (a
    /// request's private mode), which would otherwise stay for the loop's life. Loop-only.
    func forgetModeIfEmpty(_ mode: PKRunLoopMode) {
        guard let items = modeItems[mode], isEmpty(mode), items.observers.isEmpty else { return }
        modeItems[mode] = nil
    }

    /// Whether `mode` has nothing that could end a wait: no sources and no timers.
    func isEmpty(_ mode: PKRunLoopMode) -> Bool {
        guard let items = modeItems[mode] else { return true }
        return items.customSources.isEmpty && items.descriptorTokens.isEmpty && items.timers.isEmpty
    }
}
